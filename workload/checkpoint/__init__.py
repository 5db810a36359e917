"""Checkpoints: atomic, verified saves of the whole training state, exact resume, and
preemption (a signal -> one checkpoint -> exit status 75 -> the job script requeues).

    formats.py   the file formats: state trees as JSON + safetensors, pickles refused,
                 the strict JSON and safetensors readers and the durable write
    store.py     one checkpoint: its layout, atomic save with a manifest, verify
    folder.py    the run's checkpoints folder and its timeline: the steps it holds,
                 `latest`, pruning, moving bad ones aside, rollbacks, what --overwrite
                 removes
    content.py   what a loaded checkpoint must hold (random states included), and that
                 it fits the live model, optimizer, schedule and scaler
    snapshot.py  the live training state <-> a checkpoint (take, read, restore), FSDP2
                 shards joined for any world size, the random states
    saving.py    when to save (Checkpointer), the collective save, preemption's save
                 and agreement across ranks, a save that runs out of disk space
    resume.py    which checkpoint a run continues from (--resume, --overwrite), and
                 whether one fits this run
    lock.py      one writer per run folder (train.lock, stale-lock detection)

The public API is what this module exports; code outside the package uses nothing else.
"""

from workload.checkpoint.folder import checkpoints_dir, step_name
from workload.checkpoint.lock import lock_run_folder
from workload.checkpoint.resume import prepare, resume
from workload.checkpoint.saving import (REQUEUE_EXIT_STATUS, Checkpointer, Preempted,
                                        PreemptionFlag, guarded_final_model, request_requeue,
                                        save_checkpoint, tensor_bytes)
from workload.checkpoint.snapshot import take_snapshot
from workload.checkpoint.store import CorruptCheckpoint

__all__ = ["Checkpointer", "CorruptCheckpoint", "Preempted", "PreemptionFlag",
           "REQUEUE_EXIT_STATUS", "checkpoints_dir", "guarded_final_model",
           "lock_run_folder", "prepare", "request_requeue", "resume", "save_checkpoint",
           "step_name", "take_snapshot", "tensor_bytes"]
