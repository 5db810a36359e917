"""A checkpoint of the live training state: taken from it (`take_snapshot`, a collective),
written (`save_checkpoint`), read back (`read_checkpoint`) and put back (`restore`).

The files and their safety rules are workload.checkpoint.store's; FSDP shards are
workload.checkpoint.sharded's.
"""

from __future__ import annotations

from pathlib import Path

import torch

from workload import distributed
from workload.checkpoint import rng
from workload.checkpoint.content import check_loaded, read_config
from workload.checkpoint.sharded import (METADATA, SHARDED_DIR, load_sharded,
                                         read_metadata_safely, save_sharded)
from workload.checkpoint.space import guarded_save
from workload.checkpoint.store import (FORMAT_VERSION, CorruptCheckpoint, Snapshot,
                                       finish_checkpoint, move_aside, safe_load, step_name,
                                       verify)
from workload.distributed import unwrap
from workload.logs import logger


def take_snapshot(state, cfg, world_size: int, sharded: bool) -> Snapshot:
    """A collective (the RNG states of every rank are gathered): all ranks call it."""
    trainer = dict(format=FORMAT_VERSION, schedule=state.schedule.state_dict(),
                   scaler=state.scaler.state_dict(), epoch=state.epoch, batch=state.batch,
                   step=state.step, accuracies=list(state.accuracies), world_size=world_size)
    if sharded:
        # FSDP keeps buffers (BatchNorm statistics) per rank and DCP saves one copy of
        # them: every rank's own are kept here so that each gets its own back.
        buffers = {name: b for name, b in state.model.named_buffers()}
        trainer["rank_buffers"] = distributed.gather_objects(buffers, world_size)
        return Snapshot(None, None, trainer, rng.gather_states(world_size), cfg.to_dict())
    return Snapshot(unwrap(state.model).state_dict(), state.optimizer.state_dict(), trainer,
                    rng.gather_states(world_size), cfg.to_dict())


def save_checkpoint(root: Path, snapshot: Snapshot, keep: int, is_main: bool,
                    sharded_state=None) -> Path:
    """All ranks call it. Rank 0 writes (the others wait), except FSDP shards, which every
    rank writes into the same temporary folder first."""
    tmp = root / f".tmp-{step_name(snapshot.trainer['step'])}"
    if is_main:
        root.mkdir(parents=True, exist_ok=True)
        if tmp.exists() or tmp.is_symlink():  # left by a run killed while saving this step
            move_aside(tmp, "incomplete")
        with guarded_save(root, tmp, snapshot):
            tmp.mkdir()
    if sharded_state is not None:
        distributed.barrier()  # the folder exists before anyone writes into it
        save_sharded(sharded_state.model, sharded_state.optimizer, tmp / SHARDED_DIR)
    final = root / step_name(snapshot.trainer["step"])
    if is_main:
        with guarded_save(root, tmp, snapshot):
            finish_checkpoint(tmp, final, snapshot, keep)
    distributed.barrier()  # the others wait until the checkpoint is complete
    return final



def read_checkpoint(path: Path, device) -> Snapshot:
    """Verify and load every file of one checkpoint (tensors onto `device`); FSDP shards
    are only checked here and read by every rank in `restore`."""
    manifest = verify(path)
    names = ["trainer.pt", "rng.pt"]
    if manifest.get("sharded"):
        try:
            read_metadata_safely(path / SHARDED_DIR)
        except Exception as error:  # UnsafeMetadata, UnpicklingError, EOFError, ...
            raise CorruptCheckpoint(f"{path.name}/{SHARDED_DIR}/{METADATA} cannot be read "
                                    f"safely: {error}") from None
    else:
        names = ["model.pt", "optimizer.pt", *names]
    loaded = {name: safe_load(path / name, "cpu" if name == "rng.pt" else device)
              for name in names}
    config = read_config(path)
    check_loaded(path, loaded["trainer.pt"], loaded["rng.pt"], loaded.get("model.pt"),
                 loaded.get("optimizer.pt"), bool(manifest.get("sharded")))
    return Snapshot(loaded.get("model.pt"), loaded.get("optimizer.pt"), loaded["trainer.pt"],
                    loaded["rng.pt"], config)


def restore(snapshot: Snapshot, state, rank: int, world_size: int, path: Path) -> None:
    """Put a loaded checkpoint into the live training state of this rank (a collective
    for FSDP shards)."""
    trainer = snapshot.trainer
    if snapshot.model is None:
        load_sharded(state.model, state.optimizer, path / SHARDED_DIR)
        own = trainer["rank_buffers"][rank % len(trainer["rank_buffers"])]
        with torch.no_grad():
            for name, buffer in state.model.named_buffers():
                buffer.copy_(own[name])
    else:
        unwrap(state.model).load_state_dict(snapshot.model)
        state.optimizer.load_state_dict(snapshot.optimizer)
    state.schedule.load_state_dict(trainer["schedule"])
    state.scaler.load_state_dict(trainer["scaler"])
    state.epoch, state.batch, state.step = trainer["epoch"], trainer["batch"], trainer["step"]
    state.accuracies[:] = trainer["accuracies"]
    if trainer["world_size"] != world_size:
        logger.warning(f"the checkpoint was written by {trainer['world_size']} processes, this "
                       f"run has {world_size}: training continues, but the data order from "
                       "here differs from an uninterrupted run")
    rng.set_states(snapshot.rng[rank % len(snapshot.rng)])
