"""The live training state <-> a checkpoint's contents: taken from it (`take_snapshot`,
a collective), read back (`read_checkpoint`) and put back (`restore`), FSDP's shards
included, and the random states an exact resume needs. One module because each of these
crosses between the live model, optimizer and generators and what the files hold; the
files and their safety rules are workload.checkpoint.writer.store's and formats', when a save
runs is workload.checkpoint.policy's, and how, saves'.

FSDP2 checkpoints as safetensors: every rank writes its own shard, and any number of ranks
reads them back.

Each rank writes `shards/rank-NNNNN.safetensors` (its rows of every parameter and of
every optimizer state, `DTensor.to_local()`, and its own buffers) and `rank-NNNNN.json`:
the structure of its model and optimizer state dicts, and for each sharded tensor its
global shape and the rows this rank holds (FSDP2 places parameters as `Shard(0)`: dim 0
split like torch.chunk, ceil(rows / ranks) rows each, the last ranks with fewer or none).
Reading joins the rows of every rank's file into full tensors on the CPU (the layouts must
tile each tensor exactly), so a checkpoint written by N ranks loads into M ranks, sharded
or not: `load_model` and `load_optimizer` give each rank its slice of the full tensors
with `distribute_tensor`, which places them exactly as FSDP2 does.
No DCP, no pickle: torch.distributed.checkpoint's `.metadata` is a pickle.

Random states: dropout draws from torch's global generator, so an exact resume needs it
back; numpy and python `random` are saved too for user code. Everything is converted to
tensors (torch's states are uint8 tensors, numpy's key an int64 tensor), numbers, strings
and lists, so that they go into rng.safetensors and rng.json (their checks:
workload.checkpoint.content).
"""

from __future__ import annotations

import hashlib
import random
from pathlib import Path

import numpy as np
import torch
from torch import nn

from workload.checkpoint.content import (check_loaded, check_state, numpy_state, python_state,
                                         read_config)
from workload.checkpoint.writer.durable import (CorruptCheckpoint, json_bytes, read_json,
                                                record_bytes, write_durably)
from workload.checkpoint.formats import (PART_FORMAT, Shard, assemble, cpu_copy, decode, encode,
                                         part_files, read_part, read_tensors, safetensors_bytes)
from workload.checkpoint.writer.store import (FORMAT_VERSION, MODEL_FILE, SHARDS_DIR, Snapshot,
                                              verify)
from workload.distributed import gather_objects, unwrap
from workload.logs import logger

# The class count of the run's data, recorded in a checkpoint's config.json beside the
# settings: a data folder of another class count is another run (the flags do not show it).
CLASSES = "classes_in_data"


def run_settings(cfg, num_classes: int) -> dict:
    """What a checkpoint records of its run, and what a resume compares: the resolved
    config and the class count of the data."""
    return {**cfg.to_dict(), CLASSES: num_classes}


def take_snapshot(state, settings: dict, world_size: int, sharded: bool) -> Snapshot:
    """A collective (the RNG states of every rank are gathered): all ranks call it.
    `settings`: run_settings()."""
    trainer = dict(format=FORMAT_VERSION, schedule=state.schedule.state_dict(),
                   scaler=state.scaler.state_dict(), epoch=state.epoch, batch=state.batch,
                   step=state.step, accuracies=list(state.accuracies), world_size=world_size)
    for part in state.parts.values():  # every rank, in one order: the parts' collectives
        if hasattr(part, "gather_across_ranks"):
            part.gather_across_ranks()
    for name, part in state.parts.items():
        trainer[name] = part.state_dict()
    if sharded:  # every rank writes its own shard (its buffers included) in save_checkpoint
        return Snapshot(None, None, trainer, gather_states(world_size), settings)
    return Snapshot(unwrap(state.model).state_dict(), state.optimizer.state_dict(), trainer,
                    gather_states(world_size), settings)


def checkpoint_files(snapshot: Snapshot, put=cpu_copy) -> list[tuple[str, bytes | dict]]:
    """Every file of a checkpoint of `snapshot` but the manifest and FSDP's shards, in
    writing order: JSON as bytes, a safetensors file as its tensors, each where `put`
    placed it (a CPU copy for a synchronous save, a slice of the staging buffer for the
    writer process's: workload.checkpoint.background). One list for both, so that both
    write the same files."""
    files: list[tuple[str, bytes | dict]] = []
    if snapshot.model is not None:
        tensors: dict = {}
        for name, value in snapshot.model.items():
            put(tensors, name, value)
        files += [(MODEL_FILE, tensors), *part_files("optimizer", snapshot.optimizer, put)]
    files += [*part_files("trainer", snapshot.trainer, put), *part_files("rng", snapshot.rng, put)]
    files.append(("config.json", record_bytes(snapshot.config)))
    return files


def read_checkpoint(path: Path) -> Snapshot:
    """Verify and read every file of one checkpoint, onto the CPU (`restore` copies the
    tensors to the device); FSDP shards are joined into full tensors."""
    manifest = verify(path)
    trainer = read_part(path, "trainer")
    states = read_part(path, "rng")
    check_loaded(path, trainer, states, manifest)
    buffers = None
    if manifest.get("sharded"):
        model, optimizer, buffers = read_shards(path / SHARDS_DIR, trainer["world_size"],
                                                manifest["files"])
        where = f"{SHARDS_DIR}/"
    else:
        model = read_tensors(path / MODEL_FILE)
        optimizer = read_part(path, "optimizer")
        where = MODEL_FILE
    check_state(path, where, model, optimizer)
    return Snapshot(model, optimizer, trainer, states, read_config(path), buffers)


def restore(snapshot: Snapshot, state, rank: int, world_size: int) -> None:
    """Put a loaded checkpoint into the live training state of this rank (a collective
    when the live model is sharded), whatever the world size that wrote it."""
    trainer = snapshot.trainer
    buffers = snapshot.rank_buffers
    own = buffers[rank] if buffers and rank < len(buffers) else None
    load_model(state.model, snapshot.model, own)
    load_optimizer(state.optimizer, snapshot.optimizer)
    state.schedule.load_state_dict(trainer["schedule"])
    state.scaler.load_state_dict(trainer["scaler"])
    state.epoch = trainer["epoch"]
    state.batch = trainer["batch"]
    state.step = trainer["step"]
    state.accuracies[:] = trainer["accuracies"]
    for name, part in state.parts.items():  # each part checks what it is given itself
        part.load_state_dict(trainer.get(name))
    if trainer["world_size"] != world_size:
        logger.info(f"the checkpoint was written by {trainer['world_size']} processes, this "
                       f"run has {world_size}: the full parameters and optimizer state carry "
                       "over, but the data order from here differs from an uninterrupted run")
    if rank < len(snapshot.rng):
        set_states(snapshot.rng[rank])
    else:  # a rank the checkpoint has no states of: its own, derived from the seed
        derive_states(snapshot.config.get("seed", 0), trainer["step"], rank)


# --- random states ------------------------------------------------------------

def local_states() -> dict:
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    version, internal, gauss_next = random.getstate()
    states = dict(
        torch=torch.get_rng_state(),
        numpy=dict(kind=kind, keys=torch.from_numpy(keys.astype(np.int64)), pos=int(pos),
                   has_gauss=int(has_gauss), cached=float(cached)),
        python=dict(version=version, internal=list(internal), gauss_next=gauss_next),
    )
    if torch.cuda.is_available():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def set_states(states: dict) -> None:
    torch.set_rng_state(states["torch"].cpu())
    np.random.set_state(numpy_state(states["numpy"]))
    random.setstate(python_state(states["python"]))
    if "cuda" in states and torch.cuda.is_available():
        cuda = [s.cpu() for s in states["cuda"]]
        if len(cuda) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(cuda)


def derive_states(seed: int, step: int, rank: int) -> None:
    """Random states for a rank the checkpoint has none of (it was written by fewer
    ranks): torch (CPU and CUDA), numpy and python seeded from (seed, step, rank), the
    same in every run that resumes the same way."""
    digest = hashlib.sha256(f"{seed}:{step}:{rank}".encode()).digest()
    value = int.from_bytes(digest[:8], "little") >> 1
    torch.manual_seed(value)
    np.random.seed(value % 2**32)
    random.seed(value)


def gather_states(world_size: int) -> list[dict]:
    """Every rank's states, in rank order (a collective: all ranks must call it)."""
    return gather_objects(local_states(), world_size)


# --- FSDP shards --------------------------------------------------------------

def shard_name(rank: int) -> str:
    return f"rank-{rank:05d}"


def is_sharded(model: nn.Module) -> bool:
    """FSDP2 turns parameters into DTensors (which have `full_tensor`)."""
    return any(hasattr(p, "full_tensor") for p in model.parameters())


def save_shards(model: nn.Module, optimizer, folder: Path, world_size: int) -> dict:
    """Every rank writes its own shard file and layout (fsynced); their manifest entries
    by file name (rank 0 gathers them for the manifest)."""
    rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
    tensors: dict = {}
    state = encode({"model": unwrap(model).state_dict(), "optimizer": optimizer.state_dict()},
                   tensors)
    name = shard_name(rank)
    layout = dict(format=PART_FORMAT, rank=rank, world_size=world_size, state=state)
    return {f"{name}.safetensors": write_durably(folder / f"{name}.safetensors",
                                                 safetensors_bytes(tensors)),
            f"{name}.json": write_durably(folder / f"{name}.json", json_bytes(layout))}


def _read_shard(folder: Path, rank: int, world_size: int, listed) -> dict:
    name = shard_name(rank)
    for suffix in (".json", ".safetensors"):
        if f"{folder.name}/{name}{suffix}" not in listed:
            raise CorruptCheckpoint(f"{folder.parent.name}/{folder.name}/{name}{suffix} "
                                    f"is missing: {world_size} ranks wrote this checkpoint")
    layout = read_json(folder / f"{name}.json")
    tensors = read_tensors(folder / f"{name}.safetensors")
    try:
        if (layout["rank"], layout["world_size"]) != (rank, world_size):
            raise ValueError(f"it says rank {layout['rank']} of {layout['world_size']}")
        return decode(layout["state"], tensors)
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        raise CorruptCheckpoint(f"{folder.parent.name}/{folder.name}/{name}.json is not "
                                f"the layout of its shard ({error})") from None


def read_shards(folder: Path, world_size, listed) -> tuple[dict, dict, list[dict]]:
    """The full model and optimizer state dicts joined from every rank's shard, and each
    rank's own buffers; `listed`: the file names in the manifest."""
    if not isinstance(world_size, int) or world_size < 1:
        raise CorruptCheckpoint(f"{folder.parent.name}: the world size {world_size!r} of "
                                "its trainer state is not a number of ranks")
    trees = [_read_shard(folder, rank, world_size, listed) for rank in range(world_size)]
    try:
        full = assemble(trees)
        buffers = [{k: v for k, v in t["model"].items() if not isinstance(v, Shard)}
                   for t in trees]
        return full["model"], full["optimizer"], buffers
    except (KeyError, TypeError, ValueError, AttributeError, RuntimeError) as error:
        raise CorruptCheckpoint(f"{folder.parent.name}/{folder.name}: the shards do not "
                                f"fit together ({error})") from None


def _to_live(full: torch.Tensor, live) -> torch.Tensor:
    """`full` as the live tensor is laid out: this rank's slice of an FSDP2 DTensor (a
    collective), else the tensor itself (load_state_dict copies it to the device)."""
    if _is_dtensor(live):
        from torch.distributed.tensor import distribute_tensor

        return distribute_tensor(full.to(live.device), live.device_mesh, live.placements)
    return full


def load_model(model: nn.Module, full: dict, buffers: dict | None = None) -> None:
    """Full tensors into the live model, sharded or not; `buffers` (this rank's own
    BatchNorm statistics) take precedence over the full state's."""
    module = unwrap(model)
    own = buffers or {}
    live = module.state_dict()
    module.load_state_dict({name: _to_live(own.get(name, full[name]), tensor)
                            for name, tensor in live.items()})


def load_optimizer(optimizer, full: dict) -> None:
    """A full optimizer state dict into the live optimizer: each state tensor shaped like
    its parameter is laid out like it (sharded under FSDP2)."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    state = {}
    for index, values in full["state"].items():
        param = params[index]
        state[index] = {key: _like_param(value, param) if isinstance(value, torch.Tensor)
                        and value.dim() > 0 and tuple(value.shape) == tuple(param.shape)
                        else value for key, value in values.items()}
    optimizer.load_state_dict({"state": state, "param_groups": full["param_groups"]})


def _like_param(value: torch.Tensor, param) -> torch.Tensor:
    """`value` on the parameter's device with its strides. A checkpoint's tensors are
    contiguous, while a channels-last model's conv weights are not, and the fused
    optimizers refuse a momentum buffer strided otherwise than its parameter
    (`check_fast_path_restrictions`: the first CUDA step after a resume failed)."""
    if _is_dtensor(param):
        return _to_live(value, param)
    return torch.empty_like(param, dtype=value.dtype).copy_(value)


def _is_dtensor(tensor) -> bool:
    """An FSDP2 parameter or state tensor: a DTensor, this rank's slice of the whole."""
    return hasattr(tensor, "placements") and hasattr(tensor, "device_mesh")
