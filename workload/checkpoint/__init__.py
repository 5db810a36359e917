"""Checkpoints: atomic, verified saves of the whole training state, exact resume, and
preemption (a signal -> one checkpoint -> exit status 75 -> the job script requeues).

    formats.py     the file formats: state trees as JSON + safetensors, pickles refused
    store.py       the files: layout, atomic save with a manifest, verify,
                   moving bad ones aside, pruning
    snapshot.py    the live training state <-> a checkpoint (take, save, read, restore)
    sharded.py     FSDP2 shards as safetensors per rank, joined on load for any world size
    rng.py         the random states an exact resume needs
    resume.py      which checkpoint a run continues from (--resume, --overwrite), and
                   whether one fits this run (its recorded settings and class count)
    timeline.py    the run's timeline (`latest`), rollbacks, what --overwrite removes
    content.py     what a loaded checkpoint must hold, and that it fits the live model
    space.py       a save that runs out of disk space: partial folder removed, one line
    lock.py        one writer per run folder (train.lock, stale-lock detection)
    policy.py      when to save (Checkpointer: --checkpoint-every, epoch ends, preemption)
    preemption.py  the signal flag, the agreement across ranks, the requeue request

The public API is what this module exports; the training loop uses nothing else.
"""

from workload.checkpoint.lock import lock_run_folder
from workload.checkpoint.policy import Checkpointer
from workload.checkpoint.preemption import (REQUEUE_EXIT_STATUS, Preempted, PreemptionFlag,
                                            request_requeue)
from workload.checkpoint.resume import prepare, resume
from workload.checkpoint.space import guarded_final_model, tensor_bytes
from workload.checkpoint.store import CorruptCheckpoint, checkpoints_dir, step_name

__all__ = ["Checkpointer", "CorruptCheckpoint", "Preempted", "PreemptionFlag",
           "REQUEUE_EXIT_STATUS", "checkpoints_dir", "guarded_final_model",
           "lock_run_folder", "prepare", "request_requeue", "resume", "step_name",
           "tensor_bytes"]
