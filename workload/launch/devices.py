"""The CPUs and the GPU one process owns, read without importing torch.

CPUs: the one place a process's thread count and its data workers come from. A task's
CPUs are SLURM_CPUS_PER_TASK (capped by the affinity mask: a bogus 999999999 would make
libgomp abort at start), else its affinity mask. They are shared by the processes started
inside it: torchrun's LOCAL_WORLD_SIZE workers in one task (one task per node), or the
processes of one node started without SLURM (they share one mask). A task of its own per
process (srun per task) owns all of its task's CPUs.

The GPU: a task started with ``srun --gpus-per-task=1`` (or with a narrowed
CUDA_VISIBLE_DEVICES) sees one GPU, numbered 0, while its LOCAL_RANK may be 3: the usual
``torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))`` then fails. The launch layer
picks device 0 there (the local rank when the task sees the node's GPUs) and exports the
choice as LOCAL_GPU, the variable a script should index its GPU with.
"""

from __future__ import annotations

import os
from pathlib import Path
from collections.abc import Mapping

from workload.launch.variables import under_torchrun, whole_number


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask: SLURM's cgroup, taskset, ...)."""
    return len(os.sched_getaffinity(0))


def process_cpus(env: Mapping[str, str], local_processes: int = 1,
                 usable: int | None = None, warnings: list[str] | None = None) -> int:
    """The CPUs this process owns (at least 1); `local_processes`: LOCAL_WORLD_SIZE.

    A SLURM_CPUS_PER_TASK above what the process may use is capped, with a warning
    appended to `warnings` when given.
    """
    usable = usable_cpus() if usable is None else usable
    task = whole_number(env, "SLURM_CPUS_PER_TASK", minimum=1)
    if task is None:
        return max(1, usable // max(1, local_processes))
    if task > usable:
        if warnings is not None:
            warnings.append(f"SLURM_CPUS_PER_TASK={task} but this process may use only "
                            f"{usable} CPUs (its affinity mask): threads and data workers "
                            f"are derived from {usable}; set OMP_NUM_THREADS to choose")
        task = usable
    sharing = local_processes if under_torchrun(env) else 1
    return max(1, task // max(1, sharing))



def default_workers(local_world_size: int = 1) -> int:
    """DataLoader workers per process: the CPUs it owns (its share of the task's under
    torchrun), one left for the training loop, at most 8."""
    return max(0, min(8, process_cpus(os.environ, local_world_size) - 1))

def thread_count(env: Mapping[str, str], owned: int, local_processes: int = 1) -> int | None:
    """Threads per process: the user's OMP_NUM_THREADS, else the CPUs it owns when SLURM
    says how many its task has; None = leave torch's default alone."""
    user = env.get("OMP_NUM_THREADS")
    # torchrun sets OMP_NUM_THREADS=1 for its workers (more than one) when it was unset:
    # not a choice.
    torchrun_default = under_torchrun(env) and user == "1" and local_processes > 1
    if user and not torchrun_default:
        return whole_number(env, "OMP_NUM_THREADS", minimum=1)
    if env.get("SLURM_CPUS_PER_TASK") in (None, ""):
        return None
    return owned


# The variable entrypoint.sh and workload.launch.setup() export: this process's GPU,
# an index among the GPUs it sees (so always valid for torch.cuda.set_device).
GPU_VARIABLE = "LOCAL_GPU"


def visible_gpu_count(env: Mapping[str, str], dev: Path = Path("/dev")) -> int:
    """GPUs this process may use, without importing torch (the entrypoint runs this)."""
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([item for item in visible.split(",") if item.strip() not in ("", "-1")])
    return len([p for p in dev.glob("nvidia[0-9]*") if p.name[6:].isdigit()])


def gpu_index(visible_gpus: int, local_rank: int) -> int | None:
    """Device 0 when each task sees exactly one GPU, else the local rank.

    A local rank past the visible GPUs (more tasks on the node than GPUs each sees)
    wraps around, and resolve() warns about it: see local_rank_warning().
    """
    if visible_gpus <= 0:
        return None
    if visible_gpus == 1:
        return 0
    return local_rank if local_rank < visible_gpus else local_rank % visible_gpus


def local_rank_warning(visible_gpus: int, local_rank: int) -> str | None:
    """The pitfall, named with its fix, when LOCAL_RANK cannot index the visible GPUs."""
    if visible_gpus <= 0 or local_rank < visible_gpus:
        return None
    index = gpu_index(visible_gpus, local_rank)
    return (f"LOCAL_RANK={local_rank} cannot index the {visible_gpus} GPU(s) this process "
            f"sees (srun --gpus-per-task or a narrowed CUDA_VISIBLE_DEVICES), so "
            f"torch.cuda.set_device(LOCAL_RANK) fails; use {GPU_VARIABLE}={index} "
            f"(exported by entrypoint.sh and workload.launch.setup()) instead of "
            f"LOCAL_RANK, or let each task see the node's GPUs (srun --gpus-per-node)")
