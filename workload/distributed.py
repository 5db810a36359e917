"""Process group, device and model wrapping for one or many processes.

``init_distributed`` applies the launch resolution (workload.launch) to this process,
so ``train`` works the same under ``srun``, ``torchrun``, ``apptainer exec`` and
``docker run``: it resolves the variables (and exports them when it is one of several
ranks), picks the GPU (device 0 when the task sees one GPU, else LOCAL_RANK), sets the
thread count, and starts a process group when WORLD_SIZE > 1 (NCCL on GPUs, gloo on the
CPU) with an explicit timeout.
"""

from __future__ import annotations

import os
import sys
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn

from workload.errors import UsageError
from workload.launch import Launch, LaunchError, Resolution, resolve
from workload.launch.preemption import PreemptionFlag, signals_end_the_wait
from workload.logs import warn


def _from_launch(name: str) -> property:
    return property(lambda info: getattr(info.launch, name), doc=f"The launch record's {name}.")


@dataclass(frozen=True)
class DistInfo:
    """Where this process sits in the job, and what torch made of it. The place is the
    launch layer's own record (`launch`: rank, world size, layout, ...; the record a
    user's script gets from setup()), read through here rather than copied; this adds the
    device as torch's and the process group's backend."""

    launch: Launch
    device: torch.device
    backend: str | None = None  # None: one process, no process group

    rank = _from_launch("rank")
    local_rank = _from_launch("local_rank")
    world_size = _from_launch("world_size")
    local_world_size = _from_launch("local_world_size")
    layout = _from_launch("layout")  # single, per-task or torchrun-per-node
    is_main = _from_launch("is_main")

    @property
    def num_nodes(self) -> int:
        return max(1, self.world_size // max(1, self.local_world_size))

    @classmethod
    def alone(cls, device: torch.device) -> DistInfo:
        """One process by itself on `device` (tools and tests that start no job)."""
        return cls(Launch(0, 0, 1, 1, 0, str(device)), device)

    @classmethod
    def of_group(cls) -> DistInfo:
        """This process in the process group a user's own script started (its collectives
        on the device its backend uses), or alone on the CPU when it started none."""
        if not (dist.is_available() and dist.is_initialized()):
            return cls.alone(torch.device("cpu"))
        backend = str(dist.get_backend())
        device = (torch.device("cuda", torch.cuda.current_device()) if "nccl" in backend
                  else torch.device("cpu"))
        rank = dist.get_rank()
        world = dist.get_world_size()
        return cls(Launch(rank, 0, world, 1, 0, str(device)), device, backend)


def apply_launch_env(env=os.environ) -> Resolution:
    """Resolve the launch variables; export them when this process is one of several.

    A single process leaves the environment alone (``train`` may run inside another
    program, such as the test suite); a rank of a distributed job exports what it
    resolved, for libraries that read LOCAL_RANK and friends, by the launch layer's one
    rule (`Resolution.export`, as setup() does).
    """
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    res = resolve(env, visible_gpus=gpus)
    for warning in res.warnings:
        warn("launch", warning)
    if int(res.values["WORLD_SIZE"]) > 1:
        res.export(env)
    if res.threads is not None:
        torch.set_num_threads(res.threads)
    return res


def resolve_device(flag: str, local_rank: int = 0) -> torch.device:
    """The training device for `--device auto|cpu|cuda`; `local_rank` picks the GPU."""
    if flag == "cpu" or (flag == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise UsageError("--device cuda, but no GPU is visible to PyTorch "
                         "(torch.cuda.is_available() is False); run on a GPU node "
                         "(apptainer exec --nv / docker run --gpus all) or pass --device cpu")
    count = torch.cuda.device_count()
    if local_rank >= count:
        raise UsageError(f"LOCAL_RANK={local_rank} needs GPU {local_rank}, but this task sees "
                         f"{count}; start one task per GPU (srun --ntasks-per-node={count}) "
                         f"or give each task one GPU (srun --gpus-per-task=1)")
    return torch.device("cuda", local_rank)


def pick_device(requested: str, res: Resolution) -> torch.device:
    """auto: the rank's GPU when CUDA is usable (device 0 if the task sees one), else CPU."""
    chosen = resolve_device(requested, res.gpu_index or 0)
    if chosen.type == "cuda":
        torch.cuda.set_device(chosen)  # GPU-only line
    return chosen


def init_distributed(device: str, timeout_s: float, flag: PreemptionFlag | None) -> DistInfo:
    """Resolve the launch, choose the device, and join the process group if needed.

    A bad launch variable is a UsageError (exit status 2) raised before any work starts.
    `flag`: the command's (train's PreemptionFlag, another command's StartUpFlag; None
    where none answers signals), acted on for a signal during the rendezvous.
    """
    try:
        res = apply_launch_env()
    except LaunchError as error:
        raise UsageError(str(error)) from None
    chosen = pick_device(device, res)
    place = Launch.resolved(res, chosen.index if chosen.type == "cuda" else None)
    if place.world_size == 1:
        return DistInfo(place, chosen)
    join_group(place.backend, timeout_s, place.rank, place.world_size, flag)
    return DistInfo(place, chosen, place.backend)


def join_group(backend: str, timeout_s: float, rank: int, world_size: int,
               flag: PreemptionFlag | None) -> None:
    """init_process_group; a rendezvous that cannot form is one line naming the address
    and the fix (an occupied port, a rank that never came), not torch's traceback."""
    with _held_stderr() as held, signals_end_the_wait(
            f"the other ranks at start-up (rank {rank} of {world_size})", held.stderr, flag):
        try:
            timeout = timedelta(seconds=timeout_s)
            dist.init_process_group(backend, timeout=timeout, store=elastic_store(timeout),
                                    rank=rank, world_size=world_size)
        except (dist.DistError, RuntimeError, TimeoutError, ConnectionError) as error:
            held.failed = True
            raise UsageError(rendezvous_failure(str(error), rank, world_size,
                                                timeout_s)) from None


class _Held:
    failed = False  # stderr: the descriptor of the real one while it is held
    stderr = 2


@contextmanager
def _held_stderr():
    """File descriptor 2 into a temporary file while the group forms: torch's C++ side
    logs every retry with a C++ stack. Replayed after success (or with
    TORCH_DISTRIBUTED_DEBUG set), dropped after a failure, whose one line says it all."""
    sys.stderr.flush()
    saved = os.dup(2)
    held = _Held()
    held.stderr = saved
    with tempfile.TemporaryFile() as log:
        os.dup2(log.fileno(), 2)
        try:
            yield held
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            if not held.failed or os.environ.get("TORCH_DISTRIBUTED_DEBUG"):
                log.seek(0)
                sys.stderr.write(log.read().decode(errors="replace"))
                sys.stderr.flush()


def rendezvous_failure(error: str, rank: int, world_size: int, timeout_s: float) -> str:
    where = f"{os.environ.get('MASTER_ADDR', '?')}:{os.environ.get('MASTER_PORT', '?')}"
    first = next((line.strip() for line in error.splitlines() if line.strip()), "")
    if "EADDRINUSE" in error or "address already in use" in error.lower():
        return (f"rank {rank} cannot open the rendezvous port {where}: the port is in use "
                "(another job or run on this node); set MASTER_PORT to a free port, or end "
                "the process that holds it")
    return (f"rank {rank} of {world_size} could not join the process group at {where} "
            f"within {timeout_s:g} s ({first[:200]}); check that all {world_size} ranks "
            f"were started and that {where} is rank 0's host and a port it can reach, or "
            "give slow starts more time (train: --dist-start-timeout; bench, evaluate: "
            "--dist-timeout)")


def elastic_store(timeout: timedelta, env=os.environ) -> dist.Store | None:
    """The agent's store under a per-restart prefix, when torchrun shares one; else None.

    torchrun's agent keeps one TCPStore for all restarts of its workers (see the note in
    workload/launch/resolve.py, pytorch/pytorch#135712 and #167288): a restarted group
    finds the dead group's keys there and gloo/NCCL connect to ranks that no longer
    exist. With a single agent (one node) every worker has the same
    TORCHELASTIC_RESTART_COUNT, so prefixing the keys with it gives each restart empty
    keys. Across nodes the counters differ, so there only torchrun's settings help: the
    entrypoint sets them (TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1, c10d rendezvous), and
    None leaves init_process_group to its usual env:// rendezvous.
    """
    if env.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None  # no torchrun, or torchrun gives every round a fresh store
    if env.get("GROUP_WORLD_SIZE", "1") != "1":
        if int(env.get("TORCHELASTIC_MAX_RESTARTS") or 0) > 0:
            warn("launch", "torchrun shares one store across restarts of several nodes, so a "
                 "restart may not reconnect (pytorch/pytorch#135712); start torchrun through "
                 "entrypoint.sh, or set TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 and use "
                 "--rdzv-backend=c10d")
        return None
    store = dist.TCPStore(env["MASTER_ADDR"], int(env["MASTER_PORT"]), is_master=False,
                          timeout=timeout)
    return dist.PrefixStore(f"workload/restart-{env.get('TORCHELASTIC_RESTART_COUNT', '0')}",
                            store)


def teardown() -> None:
    """Leave the process group; safe to call on success, on error, and twice."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def all_reduce_sum(t: torch.Tensor) -> torch.Tensor:
    """The sum over all ranks (a copy; the input is left alone)."""
    if not (dist.is_available() and dist.is_initialized()):
        return t
    total = t.detach().clone()
    dist.all_reduce(total, op=dist.ReduceOp.SUM)
    return total


def any_rank(flags: list[bool], device: torch.device) -> list[bool]:
    """Each flag is true if any rank set it: one all-reduce MAX, written as a sum over 0/1
    values (the same for booleans). All ranks call it, so they take the same decision."""
    values = torch.tensor([float(f) for f in flags], device=device)
    return [v > 0 for v in all_reduce_sum(values).tolist()]


def main_rank_numbers(numbers: list[int], info: DistInfo) -> list[int]:
    """Rank 0's whole numbers, on every rank (what the others pass is ignored): one
    all-reduce sum to which only rank 0 adds. All ranks call it."""
    mine = numbers if info.is_main else [0] * len(numbers)
    values = torch.tensor(mine, dtype=torch.int64, device=info.device)
    return [int(v) for v in all_reduce_sum(values).tolist()]


def all_gather_floats(values: list[float], device: torch.device) -> list[list[float]]:
    """Every rank's few numbers, in rank order (one small all-gather)."""
    mine = torch.tensor(values, dtype=torch.float64, device=device)
    if not (dist.is_available() and dist.is_initialized()):
        return [mine.tolist()]
    every = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(every, mine)
    return [t.tolist() for t in every]


def set_collective_timeout(seconds: float) -> None:
    """A barrier, then `seconds` for every later collective of the default group (the
    barrier first: no rank runs under the shorter value while another is still slower to
    start; torchtitan switches the same way)."""
    if not (dist.is_available() and dist.is_initialized()):
        return
    dist.barrier()
    setter = getattr(dist, "set_timeout", None) or dist.distributed_c10d._set_pg_timeout
    setter(timedelta(seconds=seconds))


def barrier() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def wrap_model(model: nn.Module, info: DistInfo, strategy: str) -> nn.Module:
    """DDP or FSDP2 (``fully_shard``) across the ranks; the model itself when alone."""
    if info.world_size == 1 or info.backend is None:
        return model
    if strategy == "ddp":
        ids = [info.device.index] if info.device.type == "cuda" else None
        return nn.parallel.DistributedDataParallel(model, device_ids=ids)
    if strategy == "fsdp":
        return _fully_shard(model, info)
    raise ValueError(f"--strategy {strategy!r} is not known; expected ddp or fsdp")


def _fully_shard(model: nn.Module, info: DistInfo) -> nn.Module:
    """FSDP2: shard every top-level block that holds parameters, then the root."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(info.device.type, (info.world_size,))
    for child in model.children():
        if any(True for _ in child.parameters()):
            fully_shard(child, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def unwrap(model: nn.Module) -> nn.Module:
    """The user's module inside DDP (`.module`) and torch.compile (`._orig_mod`) wrappers
    (FSDP2 shards in place, no wrapper)."""
    while True:
        inner = getattr(model, "module", None) or getattr(model, "_orig_mod", None)
        if inner is None:
            return model
        model = inner


def gather_objects(mine: dict, world_size: int) -> list[dict]:
    """Every rank's `mine` (tensors moved to the CPU first), in rank order; a collective."""
    mine = _to_cpu(mine)
    if world_size == 1 or not dist.is_initialized():
        return [mine]
    gathered: list[dict | None] = [None] * world_size
    dist.all_gather_object(gathered, mine)
    return gathered


def _to_cpu(value):
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, dict):
        return {k: _to_cpu(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_to_cpu(v) for v in value]
    return value


# An allocator's failure, as torch words it: CUDA's OutOfMemoryError, the CPU's message.
_NO_MEMORY = ("can't allocate memory", "out of memory")


@contextmanager
def batch_that_fits(batch_size: int, image_size: int, device: torch.device):
    """A forward pass over a batch whose memory this device may not have (a model.json
    of image_size 2048, within train's bounds, at predict's batch of 64 asks the CPU for
    gigabytes): the allocator's failure becomes one UsageError naming the batch and the
    fix, never a traceback."""
    try:
        yield
    except RuntimeError as error:  # torch.OutOfMemoryError is one
        text = str(error)
        if not any(words in text for words in _NO_MEMORY):
            raise
        asked = text.split("tried to allocate ", 1)[-1].split(" bytes", 1)[0]
        need = (f" (it asked for {int(asked) / 2**20:,.0f} MiB more)" if asked.isdigit()
                else "")
        raise UsageError(f"a batch of {batch_size} images of {image_size}x"
                         f"{image_size} pixels does not fit in the memory of {device}{need}; "
                         f"pass a smaller --batch-size, e.g. --batch-size "
                         f"{max(1, batch_size // 16)}") from None
