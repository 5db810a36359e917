"""Checkpoints: atomic, verified saves of the whole training state, exact resume, and
preemption's save (a signal -> one checkpoint -> exit status 75 -> the job script
requeues; the flag and the status are workload.launch's).

    formats.py   the file formats: state trees as JSON + safetensors, the safetensors
                 reader
    durable.py   a checkpoint's files as bytes, torch-free: the durable write, the
                 strict JSON reader, pickles and zips refused
    store.py     one checkpoint: its layout, atomic save with a manifest, verify
    folder.py    the run's checkpoints folder and its timeline: the steps it holds,
                 `latest`, pruning, moving bad ones aside, rollbacks, what --overwrite
                 removes
    content.py   what a loaded checkpoint must hold (random states included), and that
                 it fits the live model, optimizer, schedule and scaler
    snapshot.py  the live training state <-> a checkpoint (take, read, restore), FSDP2
                 shards joined for any world size, the random states
    saving.py    when to save (Checkpointer) and what a preemption does: the policy
    saves.py     the one save entry: handed to the writer process or made in this one,
                 then copied into the run folder and pruned; every rank's agreement
    inprocess.py the save made in this process: the collective save, rank 0's commit
    diskfull.py  a save that runs out of disk space: one line, the partial files removed
    resuming.py  which checkpoint a run continues from (--resume, --overwrite), and
                 whether one fits this run
    lock.py      one writer per run folder (train.lock, stale-lock detection)
    loop.py      Checkpoints: the same saves and resumes for a user's own training loop
    loopargs.py  the checks of what a loop passes to Checkpoints, by the reader's limits,
                 and each rank's `extra`
    background.py  asynchronous saves: the staging buffer and the writer's handle
                 (WriterHandle: the requests to the writer process)
    writer.py    the writer process (torch-free: it starts at once)
    stall.py     a background writer that does not answer: named while the loop waits
                 for it (waited_writer, which train's stall watchdog reads), and left
                 behind on a preemption
    local.py     the node-local tier (--checkpoint-local): written there first, copied
                 into the run folder with the same commit, the newer one resumed from

The public API is what this module exports; code outside the package uses nothing else.
"""

import importlib

# Each public name and the module it lives in, imported on first use: importing the
# package costs no torch (`from workload.checkpoint import Checkpoints` in a script's
# first lines, and the --help of every command that imports it).
_HOMES = {
    "Checkpoints": "loop",
    "check_local": "local",
    "checkpoints_dir": "folder", "latest_step": "folder", "step_name": "folder",
    "lock_run_folder": "lock",
    "prepare": "resuming", "resume": "resuming",
    "Checkpointer": "saving", "Preempted": "saving",
    "guarded_final_model": "diskfull",
    "save_checkpoint": "inprocess", "tensor_bytes": "inprocess",
    "take_snapshot": "snapshot",
    "CorruptCheckpoint": "store",
    "waited_writer": "stall",
}
__all__ = sorted(_HOMES)


def __getattr__(name: str):
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{home}"), name)
    globals()[name] = value  # looked up once
    return value
