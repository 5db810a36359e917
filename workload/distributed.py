"""Process-group setup and the few collectives the trainer needs.

Single-process for now: `init_distributed` picks the device and returns rank 0 of 1.
(The launch layer adds SLURM/torchrun resolution, DDP and FSDP on top of this API.)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn

from workload.errors import UsageError


@dataclass(frozen=True)
class DistInfo:
    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    device: torch.device
    backend: str | None  # None when no process group was initialised (one process)

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def resolve_device(flag: str, local_rank: int = 0) -> torch.device:
    """The training device for `--device auto|cpu|cuda`."""
    if flag == "cpu" or (flag == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise UsageError("--device cuda, but no GPU is visible to PyTorch "
                         "(torch.cuda.is_available() is False); run on a GPU node "
                         "(apptainer exec --nv / docker run --gpus all) or pass --device cpu")
    return torch.device("cuda", local_rank)


def init_distributed(device: str, timeout_s: float = 600.0) -> DistInfo:
    return DistInfo(0, 0, 1, 1, resolve_device(device), None)


def teardown() -> None:
    pass


def all_reduce_sum(t: torch.Tensor) -> torch.Tensor:
    return t


def barrier() -> None:
    pass


def wrap_model(model: nn.Module, info: DistInfo, strategy: str = "ddp") -> nn.Module:
    return model
