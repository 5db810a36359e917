"""Which GPU a process takes, and the LOCAL_RANK pitfall, without importing torch.

A task started with ``srun --gpus-per-task=1`` (or with a narrowed CUDA_VISIBLE_DEVICES)
sees one GPU, numbered 0, while its LOCAL_RANK may be 3: the usual
``torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))`` then fails. The launch layer
picks device 0 there (the local rank when the task sees the node's GPUs) and exports the
choice as LOCAL_GPU, the variable a script should index its GPU with.
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping

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
