"""When to save: every N steps or T seconds (--checkpoint-every), at each epoch end, where
--max-steps stops the run, and once when preempted (then exit for a requeue). One position
is saved once: a step that is both periodic and the step limit's gives one checkpoint."""

from __future__ import annotations

import time
from pathlib import Path

from workload.checkpoint.preemption import Preempted, PreemptionFlag, agree, request_requeue
from workload.checkpoint.sharded import is_sharded
from workload.checkpoint.snapshot import run_settings, save_checkpoint, take_snapshot
from workload.checkpoint.store import checkpoints_dir
from workload.logs import logger


class Checkpointer:
    """Saves every N steps or T seconds, at each epoch end, at the step limit, and once on
    preemption."""

    def __init__(self, cfg, info, state, out: Path, batches_per_epoch: int,
                 flag: PreemptionFlag, num_classes: int):
        self.cfg, self.info, self.state, self.flag = cfg, info, state, flag
        self.settings = run_settings(cfg, num_classes)
        self.saved_at: tuple[int, int, int] | None = None  # (step, epoch, batch)
        every = cfg.checkpoint.checkpoint_every
        self.every_steps, self.every_s = every.steps, every.seconds
        self.root, self.batches_per_epoch = checkpoints_dir(out), batches_per_epoch
        self.last_save = time.monotonic()

    def after_step(self) -> None:
        state = self.state
        due_steps = bool(self.every_steps) and state.step % self.every_steps == 0
        due_time = bool(self.every_s) and time.monotonic() - self.last_save >= self.every_s
        preempt = self.flag.is_set()
        if self.info.world_size > 1:  # one collective: every rank takes the same decision
            preempt, due_time = agree([preempt, due_time], self.info.device)
        if preempt:
            self.save("preemption")
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
        started = time.perf_counter()
        sharded = is_sharded(self.state.model)
        snapshot = take_snapshot(self.state, self.settings, self.info.world_size, sharded)
        path = save_checkpoint(self.root, snapshot, self.cfg.checkpoint.keep_checkpoints,
                               self.info.is_main, self.state if sharded else None)
        logger.info(f"checkpoint ({why}) at step {self.state.step}: {path} "
                    f"in {time.perf_counter() - started:.2f}s")
        self.last_save, self.saved_at = time.monotonic(), position
