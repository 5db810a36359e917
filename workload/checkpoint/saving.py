"""Saving: when (the policy), how every rank takes part, what a preemption does, and what
a save that runs out of disk space leaves.

One module because these are one path, from the training loop's step boundary to the
files: `Checkpointer` decides when to save (every N steps or T seconds with
--checkpoint-every, at each epoch end, where --max-steps stops the run, and once when
preempted, then the exit for a requeue); one position is saved once (a step that is both
periodic and the step limit's gives one checkpoint). `save_checkpoint` is the collective
save (FSDP shards from every rank, the rest from rank 0, see workload.checkpoint.store).

Preemption: the signal handler only sets a flag (workload.launch.preemption, torch-free,
which a user's own script uses too; nothing else is safe inside a signal handler, least of
all a collective or a file write). At the next step boundary every rank contributes its
flag to one all-reduce (workload.distributed's `any_rank`), so a signal that reached a
single rank stops all of them at the same step and none is left waiting in a collective.
The trainer then saves one checkpoint and exits with REQUEUE_EXIT_STATUS; the batch script
sees it and runs `scontrol requeue` (jobs/lib/requeue.sh, docs/checkpoints.md).

A full disk: one line that names the folder and the space, the partial folder removed
(workload.checkpoint.diskfull).
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from workload import distributed
from workload.checkpoint.diskfull import guarded_save
from workload.checkpoint.folder import checkpoints_dir, move_aside, prune, step_name
from workload.checkpoint.formats import as_bytes
from workload.checkpoint.local import copy_to_run, local_root
from workload.checkpoint.snapshot import (checkpoint_files, is_sharded, run_settings,
                                          save_shards, take_snapshot)
from workload.checkpoint.store import SHARDS_DIR, Snapshot, finish_checkpoint, header
# The flag and the requeue request live in the launch layer (torch-free), where a user's
# own script can use them too; this module adds what needs torch.
from workload.launch.preemption import (REQUEUE_EXIT_STATUS,  # noqa: F401 (re-exported)
                                        PreemptionFlag, request_requeue)
from workload.logs import logger

# What may hold a tensor (the rest, such as a loop's millions of numbers, is passed by).
HOLDERS = (torch.Tensor, dict, list, tuple)


def tensor_bytes(value) -> int:
    """The bytes of every tensor in nested dicts and lists."""
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, dict):
        value = value.values()
    elif not isinstance(value, (list, tuple)):
        return 0
    return sum(tensor_bytes(v) for v in value if isinstance(v, HOLDERS))


def snapshot_bytes(snapshot: Snapshot) -> int:
    """The bytes of a snapshot's tensors: about what its checkpoint takes on disk."""
    return tensor_bytes([snapshot.model, snapshot.optimizer, snapshot.trainer, snapshot.rng])


def save_checkpoint(root: Path, snapshot: Snapshot, keep: int, is_main: bool,
                    sharded_state=None) -> Path:
    """All ranks call it. Rank 0 writes (the others wait), except FSDP shards, which every
    rank writes into the same temporary folder first."""
    tmp = start_save(root, snapshot, sharded_state is not None) if is_main else \
        root / f".tmp-{step_name(snapshot.trainer['step'])}"
    shard_files = _save_shards(root, tmp, snapshot, sharded_state)
    final = commit(root, tmp, snapshot, keep, shard_files) if is_main else \
        root / step_name(snapshot.trainer["step"])
    distributed.barrier()  # the others wait until the checkpoint is complete
    return final


def start_save(root: Path, snapshot: Snapshot, sharded: bool) -> Path:
    """Rank 0: the save's empty temporary folder (one a killed run left is moved aside)."""
    tmp = root / f".tmp-{step_name(snapshot.trainer['step'])}"
    root.mkdir(parents=True, exist_ok=True)
    if tmp.exists() or tmp.is_symlink():  # left by a run killed while saving this step
        move_aside(tmp, "incomplete")
    with guarded_save(root, tmp, lambda: snapshot_bytes(snapshot)):
        tmp.mkdir(mode=0o700)  # private while written: see folder.publish
        if sharded:
            (tmp / SHARDS_DIR).mkdir()
    return tmp


def commit(root: Path, tmp: Path, snapshot: Snapshot, keep: int,
           shard_files: dict | None = None) -> Path:
    """Rank 0, itself: the files, the manifest, the rename into place, `latest`, pruning;
    a full disk in one line (the writer process: workload.checkpoint.writer)."""
    step = snapshot.trainer["step"]
    final = root / step_name(step)
    with guarded_save(root, tmp, lambda: snapshot_bytes(snapshot)):
        finish_checkpoint(tmp, final, as_bytes(checkpoint_files(snapshot)), header(snapshot),
                          shard_files)
    prune(root, keep, newest=step)
    return final


def _save_shards(root: Path, tmp: Path, snapshot: Snapshot, sharded_state) -> dict:
    """FSDP: every rank writes its shard; rank 0 gets the manifest entries of all of them.
    The gather is the barrier: no rank contributes before its shard is on disk, so rank 0
    names and renames only complete files, and never reads one back to hash it."""
    if sharded_state is None:
        return {}
    world_size = snapshot.trainer["world_size"]
    distributed.barrier()  # the folder exists before anyone writes into it
    with guarded_save(root, tmp, lambda: snapshot_bytes(snapshot)):
        mine = save_shards(sharded_state.model, sharded_state.optimizer, tmp / SHARDS_DIR,
                           world_size)
    return {f"{SHARDS_DIR}/{name}": entry for entries in
            distributed.gather_objects(mine, world_size) for name, entry in entries.items()}


class Preempted(Exception):
    """Raised at a step boundary after the preemption checkpoint was written."""

    def __init__(self, step: int, signal_name: str):
        super().__init__(f"preempted by {signal_name} at step {step}")
        self.step = step


class Checkpointer:
    """Saves every N steps or T seconds, at each epoch end, at the step limit, and once on
    preemption; with --checkpoint-async (the default) rank 0's writer process commits each
    save in the background (workload.checkpoint.handover). Used as a context manager: its
    end waits for the save in flight and commits it, on leaving normally; on an exception
    it waits too, with no collective."""

    def __init__(self, cfg, info, state, out: Path, batches_per_epoch: int,
                 flag: PreemptionFlag, num_classes: int):
        from workload.checkpoint.handover import AsyncSaves

        self.cfg, self.info, self.state, self.flag = cfg, info, state, flag
        self.settings = run_settings(cfg, num_classes)
        self.saved_at: tuple[int, int, int] | None = None  # (step, epoch, batch)
        every = cfg.checkpoint.checkpoint_every
        self.every_steps, self.every_s = every.steps, every.seconds
        self.root, self.batches_per_epoch = checkpoints_dir(out), batches_per_epoch
        self.last_save = time.monotonic()
        self.saves = AsyncSaves(info, cfg.checkpoint.checkpoint_async)
        self.said_sharded = False
        local = cfg.checkpoint.checkpoint_local
        self.local = local_root(local, out) if local else None  # written first, then copied

    def after_step(self) -> None:
        state = self.state
        due_steps = bool(self.every_steps) and state.step % self.every_steps == 0
        due_time = bool(self.every_s) and time.monotonic() - self.last_save >= self.every_s
        preempt, failed = self.flag.is_set(), self.saves.failed_by_now()
        if self.info.world_size > 1:  # one collective: every rank takes the same decision
            preempt, due_time, failed = distributed.any_rank([preempt, due_time, failed],
                                                             self.info.device)
        if failed:  # the save in flight failed: said now, not at the next save
            self.settle()
        if preempt:
            self.save("preemption")
            self.settle(say=True)  # committed before any rank leaves
            why = self.flag.signal_name or "a signal to another rank"
            request_requeue(state.step, why)  # every rank, before any of them exits
            raise Preempted(state.step, why)
        # The epoch's last batch is followed by the epoch-end save: no need for two.
        if (due_steps or due_time) and state.batch < self.batches_per_epoch:
            self.save("periodic")

    def after_epoch(self, record: dict | None = None) -> None:
        self.save("epoch end")

    def at_step_limit(self) -> None:
        """--max-steps stopped an epoch partway: the position within it, so that a run
        with a larger limit continues exactly there (as after a preemption)."""
        self.save("step limit")

    def save(self, why: str) -> None:
        state = self.state
        position = (state.step, state.epoch, state.batch)
        if position == self.saved_at:  # saved already (a periodic save at the step limit)
            return
        self.settle()  # at most one save in flight: the one before is committed first
        started = time.perf_counter()
        sharded = is_sharded(self.state.model)
        snapshot = take_snapshot(self.state, self.settings, self.info.world_size, sharded)
        keep, local = self.cfg.checkpoint.keep_checkpoints, self.local
        if self.saves.enabled and not sharded:
            path = self.saves.hand_over(local or self.root, snapshot, keep,
                                        copy_to=self.root if local else None)
            done = "handed to the writer" if self.saves.in_flight is not None else "saved"
        else:
            self._say_sharded(sharded)
            first = local if local and not sharded else self.root
            path = save_checkpoint(first, snapshot, keep, self.info.is_main,
                                   self.state if sharded else None)
            if first != self.root and self.info.is_main:
                path = copy_to_run(path, self.root)
                prune(self.root, keep, newest=self.state.step)
            done = "saved"
        logger.info(f"checkpoint ({why}) at step {self.state.step}: {path} {done} "
                    f"in {time.perf_counter() - started:.2f}s")
        self.last_save, self.saved_at = time.monotonic(), position

    def _say_sharded(self, sharded: bool) -> None:
        wanted = [flag for flag, on in (("--checkpoint-async", self.saves.enabled),
                                        ("--checkpoint-local", bool(self.local))) if on]
        if sharded and wanted and not self.said_sharded:
            self.said_sharded = True
            logger.info("FSDP's per-rank checkpoint shards are saved synchronously into the "
                        "run folder (every rank writes its own; the background writer and the "
                        f"node-local tier take rank 0's state only): {' and '.join(wanted)} "
                        "apply to DDP and one-process runs")

    def settle(self, say: bool = False) -> None:
        """Every rank: the save in flight committed (its failure raised on every rank);
        `say`: with a line (the run's last save)."""
        step = self.saves.in_flight
        self.saves.settle()
        if say and step is not None:
            logger.info(f"checkpoint at step {step} committed by the background writer")

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, kind, *exc) -> None:
        try:
            if kind is None:
                self.settle(say=True)
            else:
                self.saves.wait_quietly()
        finally:
            self.saves.stop()
