"""`train`'s door to its checkpoints: when to save, and what a preemption does. How a
save is made, the resume, the preemption check and the ending are the one checkpoint
object's (workload.checkpoint.session), which a user's loop's Checkpoints holds too.

`Checkpointer` decides when to save (every N steps or T seconds with --checkpoint-every,
at each epoch end, where --max-steps stops the run, and once when preempted, then the
exit for a requeue); one position is saved once (a step that is both periodic and the
step limit's gives one checkpoint).

Preemption: the signal handler only sets a flag (workload.launch.preemption, torch-free,
which a user's own script uses too; nothing else is safe inside a signal handler, least of
all a collective or a file write). At the next step boundary every rank contributes its
flag to one all-reduce (`Session.preempted`), so a signal that reached a
single rank stops all of them at the same step and none is left waiting in a collective.
The trainer then saves one checkpoint, waits until it is committed, and exits with
workload.launch's REQUEUE_EXIT_STATUS; the batch script sees it and runs `scontrol
requeue` (jobs/lib/requeue.sh, docs/checkpoints.md).
"""

from __future__ import annotations

import time

from workload.checkpoint.local import local_root
from workload.checkpoint.session import Session
from workload.checkpoint.snapshot import is_sharded, run_settings, take_snapshot
from workload.launch.preemption import PreemptionFlag, request_requeue
from workload.logs import logger
from workload.runfolder import RunFolder


class Preempted(Exception):
    """Raised at a step boundary after the preemption checkpoint was written."""

    def __init__(self, step: int, signal_name: str):
        super().__init__(f"preempted by {signal_name} at step {step}")
        self.step = step


class Checkpointer:
    """Saves every N steps or T seconds, at each epoch end, at the step limit, and once on
    preemption; with --checkpoint-async (the default) rank 0's writer process commits each
    save in the background (workload.checkpoint.session). Used as a context manager: its
    end waits for the save in flight and commits it, on leaving normally; on an exception
    it waits too, with no collective."""

    def __init__(self, cfg, info, state, folder: RunFolder, batches_per_epoch: int,
                 flag: PreemptionFlag, num_classes: int):
        self.cfg = cfg
        self.info = info
        self.state = state
        self.flag = flag
        self.settings = run_settings(cfg, num_classes)
        self.saved_at: tuple[int, int, int] | None = None  # (step, epoch, batch)
        every = cfg.checkpoint.checkpoint_every
        self.every_steps = every.steps
        self.every_s = every.seconds
        self.root = folder.checkpoints  # through the held run folder, never a name swapped
        self.batches_per_epoch = batches_per_epoch
        self.last_save = time.monotonic()
        self.session = Session(info, cfg.checkpoint.checkpoint_async, flag)
        self.said_sharded = False
        local = cfg.checkpoint.checkpoint_local
        # written first, then copied
        self.local = local_root(local, folder.root) if local else None

    def after_step(self) -> None:
        state = self.state
        due_steps = bool(self.every_steps) and state.step % self.every_steps == 0
        due_time = bool(self.every_s) and time.monotonic() - self.last_save >= self.every_s
        # One collective: every rank takes the same decision; a save in flight that
        # failed is said now, not at the next save.
        preempt, due_time = self.session.preempted(self.flag, due_time)
        if preempt:
            self.save("preemption")
            self.session.settle(say=True)  # committed before any rank leaves
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
        self.session.settle()  # at most one save in flight: the one before is committed first
        started = time.perf_counter()
        sharded = is_sharded(self.state.model)
        snapshot = take_snapshot(self.state, self.settings, self.info.world_size, sharded)
        self._say_sharded(sharded)
        path = self.session.save(self.root, snapshot, self.cfg.checkpoint.keep_checkpoints,
                               self.state if sharded else None, self.local)
        done = "handed to the writer" if self.session.in_flight is not None else "saved"
        logger.info(f"checkpoint ({why}) at step {self.state.step}: {path} {done} "
                    f"in {time.perf_counter() - started:.2f}s")
        self.last_save = time.monotonic()
        self.saved_at = position

    def _say_sharded(self, sharded: bool) -> None:
        wanted = [flag for flag, on in (("--checkpoint-async", self.session.enabled),
                                        ("--checkpoint-local", bool(self.local))) if on]
        if sharded and wanted and not self.said_sharded:
            self.said_sharded = True
            logger.info("FSDP's per-rank checkpoint shards are saved synchronously into the "
                        "run folder (every rank writes its own; the background writer and the "
                        f"node-local tier take rank 0's state only): {' and '.join(wanted)} "
                        "apply to DDP and one-process runs")

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, kind, *exc) -> None:
        self.session.end(agree=kind is None, say=True)
