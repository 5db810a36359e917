"""A checkpoint of the live training state: taken from it (`take_snapshot`, a collective),
written (`save_checkpoint`), read back (`read_checkpoint`) and put back (`restore`).

The files and their safety rules are workload.checkpoint.store's and formats'; FSDP
shards, and putting full tensors into a live model of any world size, are
workload.checkpoint.sharded's.
"""

from __future__ import annotations

from pathlib import Path

from workload import distributed
from workload.checkpoint import rng
from workload.checkpoint.content import check_loaded, check_state, read_config
from workload.checkpoint.formats import read_part, read_tensors
from workload.checkpoint.sharded import load_model, load_optimizer, read_shards, save_shards
from workload.checkpoint.space import guarded_save
from workload.checkpoint.store import (FORMAT_VERSION, MODEL_FILE, SHARDS_DIR, Snapshot,
                                       finish_checkpoint, move_aside, step_name, verify)
from workload.distributed import unwrap
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
    if sharded:  # every rank writes its own shard (its buffers included) in save_checkpoint
        return Snapshot(None, None, trainer, rng.gather_states(world_size), settings)
    return Snapshot(unwrap(state.model).state_dict(), state.optimizer.state_dict(), trainer,
                    rng.gather_states(world_size), settings)


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
                (tmp / SHARDS_DIR).mkdir()
    shard_files = _save_shards(root, tmp, snapshot, sharded_state)
    final = root / step_name(snapshot.trainer["step"])
    if is_main:
        with guarded_save(root, tmp, snapshot):
            finish_checkpoint(tmp, final, snapshot, keep, shard_files)
    distributed.barrier()  # the others wait until the checkpoint is complete
    return final


def _save_shards(root: Path, tmp: Path, snapshot: Snapshot, sharded_state) -> dict:
    """FSDP: every rank writes its shard; rank 0 gets the manifest entries of all of them.
    The gather is the barrier: no rank contributes before its shard is on disk, so rank 0
    names and renames only complete files, and never reads one back to hash it."""
    if sharded_state is None:
        return {}
    world_size = snapshot.trainer["world_size"]
    distributed.barrier()  # the folder exists before anyone writes into it
    with guarded_save(root, tmp, snapshot):
        mine = save_shards(sharded_state.model, sharded_state.optimizer, tmp / SHARDS_DIR,
                           world_size)
    return {f"{SHARDS_DIR}/{name}": entry for entries in
            distributed.gather_objects(mine, world_size) for name, entry in entries.items()}


def read_checkpoint(path: Path, device=None) -> Snapshot:
    """Verify and read every file of one checkpoint, onto the CPU (`restore` copies the
    tensors to the device); FSDP shards are joined into full tensors. `device` is unused."""
    manifest = verify(path)
    trainer, states = read_part(path, "trainer"), read_part(path, "rng")
    check_loaded(path, trainer, states, manifest)
    buffers = None
    if manifest.get("sharded"):
        model, optimizer, buffers = read_shards(path / SHARDS_DIR, trainer["world_size"],
                                                manifest["files"])
        where = f"{SHARDS_DIR}/"
    else:
        model, optimizer = read_tensors(path / MODEL_FILE), read_part(path, "optimizer")
        where = MODEL_FILE
    check_state(path, where, model, optimizer)
    return Snapshot(model, optimizer, trainer, states, read_config(path), buffers)


def restore(snapshot: Snapshot, state, rank: int, world_size: int, path: Path) -> None:
    """Put a loaded checkpoint into the live training state of this rank (a collective
    when the live model is sharded), whatever the world size that wrote it."""
    trainer, buffers = snapshot.trainer, snapshot.rank_buffers
    own = buffers[rank] if buffers and rank < len(buffers) else None
    load_model(state.model, snapshot.model, own)
    load_optimizer(state.optimizer, snapshot.optimizer)
    state.schedule.load_state_dict(trainer["schedule"])
    state.scaler.load_state_dict(trainer["scaler"])
    state.epoch, state.batch, state.step = trainer["epoch"], trainer["batch"], trainer["step"]
    state.accuracies[:] = trainer["accuracies"]
    if trainer["world_size"] != world_size:
        logger.info(f"the checkpoint was written by {trainer['world_size']} processes, this "
                       f"run has {world_size}: the full parameters and optimizer state carry "
                       "over, but the data order from here differs from an uninterrupted run")
    if rank < len(snapshot.rng):
        rng.set_states(snapshot.rng[rank])
    else:  # a rank the checkpoint has no states of: its own, derived from the seed
        rng.derive_states(snapshot.config.get("seed", 0), trainer["step"], rank)
