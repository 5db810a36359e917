"""Progress lines for batch logs, a trainer hook on rank 0: step/total, loss, img/s, ETA
and peak GPU memory every `--log-every` steps (by default about every 30 s when stdout is
not a terminal, where the progress bar shows instead), also appended to steps.jsonl with
the fields of the log interval's exchange (workload.training.interval); and the terminal's
progress bar, a hook too (`TerminalBar`).

The step's loss stays on the device and is summed there; it is read once per line, so the
steps between two lines never wait for the device.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

from workload.files import append_jsonl
from workload.logs import Progress, logger
from workload.training.trainer import StepDone

AUTO_SECONDS = 30.0  # the interval of --log-every 0 in batch logs


def peak_memory_gib(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    return torch.cuda.max_memory_allocated(device) / 2**30


def clock(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes // 60}:{minutes % 60:02d}:{secs:02d}"


class ProgressLog:
    """The hook: counts the window since the last line; prints and records when due."""

    def __init__(self, every: int, total_steps: int, world_size: int, device: torch.device,
                 path: Path, interactive: bool | None = None, extra=dict):
        interactive = sys.stdout.isatty() if interactive is None else interactive
        self.enabled = every > 0 or not interactive
        self.every = every
        self.total = total_steps
        self.world_size = world_size
        self.device = device
        self.path = path
        self.extra = extra  # more fields for steps.jsonl (the ranks' spread of step times)
        self.started = time.perf_counter()
        self.epoch = -1
        self._reset()

    def _reset(self) -> None:
        self.window_start = time.perf_counter()
        self.loss_sum = None
        self.steps = 0
        self.images = 0

    def __call__(self, done: StepDone) -> None:
        if not self.enabled:
            return
        if done.epoch != self.epoch:  # a new window: the evaluation is no training time
            self.epoch = done.epoch
            self._reset()
            return
        loss = done.loss.float()
        self.loss_sum = loss if self.loss_sum is None else self.loss_sum + loss
        self.steps = self.steps + 1
        self.images = self.images + done.images
        due = (done.step % self.every == 0 if self.every else
               time.perf_counter() - self.window_start >= AUTO_SECONDS)
        if due:
            self.log(done)
            self._reset()

    def record(self, done: StepDone) -> dict:
        loss = self.loss_sum.item() / self.steps  # the one wait for the device
        seconds = time.perf_counter() - self.window_start
        return dict(epoch=done.epoch + 1, step=done.step, total_steps=self.total, loss=loss,
                    images_per_second=self.images * self.world_size / seconds,
                    eta_s=max(0, self.total - done.step) * seconds / self.steps,
                    peak_memory_gib=peak_memory_gib(self.device),
                    elapsed_s=time.perf_counter() - self.started, **self.extra())

    def log(self, done: StepDone) -> None:
        r = self.record(done)
        memory = ("" if r["peak_memory_gib"] is None
                  else f", peak GPU memory {r['peak_memory_gib']:.1f} GiB")
        logger.info(f"step {r['step']}/{r['total_steps']} (epoch {r['epoch']}): loss "
                    f"{r['loss']:.4f}, {r['images_per_second']:.1f} img/s, ETA "
                    f"{clock(r['eta_s'])}{memory}")
        append_jsonl(self.path, r)


class TerminalBar:
    """The epoch's progress bar on a terminal (never in batch logs): a progress hook that
    draws the step of the epoch, and an epoch-end hook that clears its line."""

    def __init__(self, steps_per_epoch: int, enabled: bool):
        self.total = steps_per_epoch
        self.enabled = enabled
        self.bar: Progress | None = None
        self.epoch = -1

    def __call__(self, done: StepDone) -> None:
        if done.epoch != self.epoch or self.bar is None:
            self.epoch = done.epoch
            self.bar = Progress(self.total, f"epoch {done.epoch + 1}", self.enabled)
        self.bar.update(done.batch)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
