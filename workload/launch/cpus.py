"""The CPUs one process owns: the one place its thread count and its data workers come from.

A task's CPUs are SLURM_CPUS_PER_TASK (capped by the affinity mask: a bogus 999999999 would
make libgomp abort at start), else its affinity mask. They are shared by the processes
started inside it: torchrun's LOCAL_WORLD_SIZE workers in one task (one task per node),
or the processes of one node started without SLURM (they share one mask). A task of its
own per process (srun per task) owns all of its task's CPUs.
"""

from __future__ import annotations

import os
from typing import Mapping

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
