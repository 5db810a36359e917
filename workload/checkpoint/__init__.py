"""Checkpoints: atomic, verified saves of the whole training state, exact resume, and
preemption's save (a signal -> one checkpoint -> exit status 75 -> the job script
requeues; the flag and the status are workload.launch's).

    By process and role: the trainer's modules here, and in writer/ the torch-free
    ones the asynchronous saves' writer process imports (it imports only that sub-package
    and the bottom layer; the trainer uses them too).

    policy.py    train's door: when to save (Checkpointer) and what a preemption does
    loop.py      the user's door: Checkpoints, the same saves and resumes for a user's
                 own training loop
    loopargs.py  the checks of what a loop passes to Checkpoints, by the reader's limits,
                 and each rank's `extra`
    meeting.py   every rank's call of a Checkpoints collective met before it starts
    session.py   the one checkpoint object behind both doors: the save entry (handed to
                 the writer process or made in this one), resume, the preemption check,
                 the ending; every rank's agreement
    resuming.py  which checkpoint train continues from (--resume, --overwrite), and
                 whether one fits this run
    formats.py   the file formats: state trees as JSON + safetensors, the safetensors
                 reader
    content.py   what a loaded checkpoint must hold (random states included), and that
                 it fits the live model, optimizer, schedule and scaler
    snapshot.py  the live training state <-> a checkpoint (take, read, restore), FSDP2
                 shards joined for any world size, the random states
    inprocess.py the save made in this process: the collective save, rank 0's own
    background.py  asynchronous saves: the staging buffer and the writer's handle
                 (WriterHandle: the requests to the writer process)
    stall.py     a background writer that does not answer: named while the loop waits
                 for it (to the stall watchdog the caller passes it), and left behind on
                 a preemption
    local.py     the node-local tier (--checkpoint-local): its folder, the newer one
                 resumed from
    lock.py      one writer per run folder (train.lock, stale-lock detection)
    writer/      durable.py (the durable write, the strict JSON reader), store.py (one
                 checkpoint: its files, the commit, how every save ends: end_save),
                 folder.py (the timeline, `latest`, the commit point: publish),
                 diskfull.py (a full disk in one line), process.py (the writer process)

The public API is what this module exports; code outside the package uses nothing else.
"""

import importlib

# Each public name and the module it lives in, imported on first use: importing the
# package costs no torch (`from workload.checkpoint import Checkpoints` in a script's
# first lines, and the --help of every command that imports it).
_HOMES = {
    "Checkpoints": "loop",
    "check_local": "local",
    "checkpoints_dir": "writer.folder", "latest_step": "writer.folder",
    "step_name": "writer.folder",
    "lock_run_folder": "lock",
    "prepare": "resuming", "resume": "resuming",
    "Checkpointer": "policy", "Preempted": "policy",
    "guarded_final_model": "writer.diskfull",
    "save_checkpoint": "inprocess", "tensor_bytes": "inprocess",
    "take_snapshot": "snapshot",
    "CorruptCheckpoint": "writer.store",
}
__all__ = sorted(_HOMES)


def __getattr__(name: str):
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{home}"), name)
    globals()[name] = value  # looked up once
    return value
