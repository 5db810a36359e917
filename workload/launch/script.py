"""``setup()``: the first call of a user's own training script, in any launch form.

    from workload.launch import setup
    import torch.distributed as dist

    me = setup()                  # rank, local rank, world size, device
    dist.init_process_group()     # no arguments: env:// finds what setup() exported

It applies the launch resolution that entrypoint.sh applies (docs/cluster.md, "How the
variables are resolved") to ``os.environ``, keeping every value torchrun or the user
already set, and sets the CUDA device when there is one: LOCAL_GPU, which is device 0
when the task sees one GPU (srun --gpus-per-task=1) whatever its LOCAL_RANK. So the same
script runs under ``srun ... python my_train.py`` (no entrypoint, as ``apptainer exec``
starts it), under ``entrypoint.sh``, under torchrun, and on a laptop as one process.

Importing this module is cheap (standard library only); ``setup()`` imports torch only
when it is installed, to count and select GPUs.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from collections.abc import Callable, MutableMapping

from workload.caches import use_private_caches
from workload.launch.devices import visible_gpu_count
from workload.launch.diagnostics import (apply_defaults, enable_dump_on_signal,
                                        held_for_the_process, user_folder)
from workload.launch.resolve import SINGLE, Resolution, resolve
from workload.logs import warn


@dataclass(frozen=True)
class Launch:
    """Where this process sits in the job, as ``setup()`` resolved it."""

    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    node_rank: int
    device: str                  # "cuda:N" (already made current) or "cpu"
    gpu_index: int | None = None  # N of cuda:N among the GPUs this process sees
    layout: str = SINGLE          # single, per-task or torchrun-per-node
    cpus: int = 1                 # CPUs it owns: its share under torchrun (DataLoader workers)

    @classmethod
    def resolved(cls, res: Resolution, gpu_index: int | None) -> Launch:
        """The record of a resolved process that uses GPU `gpu_index` (None: the CPU):
        the one builder, for setup() and for the runtime's process start alike."""
        values = {key: int(res.values[key]) for key in
                  ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "NODE_RANK")}
        device = "cpu" if gpu_index is None else f"cuda:{gpu_index}"
        return cls(values["RANK"], values["LOCAL_RANK"], values["WORLD_SIZE"],
                   values["LOCAL_WORLD_SIZE"], values["NODE_RANK"], device, gpu_index,
                   res.layout, res.cpus or 1)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def backend(self) -> str:
        """The process group backend that fits the device: nccl on a GPU, else gloo."""
        return "nccl" if self.device.startswith("cuda") else "gloo"


@dataclass(frozen=True)
class _Cuda:
    """What setup() needs from torch.cuda (replaceable in tests)."""

    count: int
    select: Callable[[int], None]
    set_threads: Callable[[int], None] | None


def _cuda() -> _Cuda | None:
    """torch's view of the GPUs, or None when torch is not installed."""
    if importlib.util.find_spec("torch") is None:
        return None
    import torch  # lazily: only a script that calls setup() pays for it

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return _Cuda(count, torch.cuda.set_device, torch.set_num_threads)


def setup(env: MutableMapping[str, str] | None = None, *, quiet: bool = False) -> Launch:
    """Resolve and export the launch variables, select the GPU, say where this process is.

    `env`: the environment to read and update (default ``os.environ``). A bad launch
    variable raises :class:`workload.launch.LaunchError`, naming it and its fix.
    Warnings (a SLURM value that disagrees with one already set, ...) go to stderr
    unless `quiet`. It points the caches the user did not set (Triton, Inductor, ...) at
    a node-local folder of this user's (workload/caches.py), turns the flight recorder on
    and, for the process's own environment, the stack dump on SIGUSR1 (docs/hangs.md),
    both into ./diagnostics.
    """
    own = env is None or env is os.environ
    env = os.environ if env is None else env
    use_private_caches("launch", env, quiet, refuse_fatal=False)  # before _cuda() imports torch
    cuda = _cuda()
    visible = cuda.count if cuda is not None else visible_gpu_count(env)
    res = resolve(env, visible_gpus=visible)
    for warning in () if quiet else res.warnings:
        warn("launch", warning)
    res.export(env)
    gpu = None
    if cuda is not None:
        if res.gpu_index is not None and cuda.count > 0:
            cuda.select(res.gpu_index)
            gpu = res.gpu_index
        if res.threads is not None and cuda.set_threads is not None:
            cuda.set_threads(res.threads)
    launch = Launch.resolved(res, gpu)
    folder = user_folder(env)
    # In this process torch's flight recorder writes through the held folder, never by
    # its name; for another process's environment (`env`) only the name can be given.
    apply_defaults(env, held_for_the_process(env, folder) if own else folder)
    if own and enable_dump_on_signal(folder, launch.rank) is None and not quiet:
        warn("launch", f"no stack dumps on SIGUSR1: {folder} cannot be written")
    return launch
