"""Progress lines for batch logs, a trainer hook on rank 0: step/total, loss, img/s, ETA
and peak GPU memory every `--log-every` steps (by default about every 30 s when stdout is
not a terminal, where the progress bar shows instead), also appended to steps.jsonl with
the fields of the log interval's exchange (workload.training.interval); and the terminal's
progress bar, a hook too (`TerminalBar`).

The step's loss stays on the device and is summed there; it is read once per line, so the
steps between two lines never wait for the device. The interval's steps, images and
seconds are the probe's (`StepProbe.lap`: the loop's one clock, which also times the
epoch): this module keeps no clock of its own.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from workload.files import append_jsonl
from workload.logs import Progress, logger
from workload.training.probe import Lap, StepProbe
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
    """The hook: sums the loss since the last line; prints and records when due."""

    def __init__(self, every: int, total_steps: int, world_size: int, probe: StepProbe,
                 path: Path, interactive: bool | None = None, extra=dict):
        interactive = sys.stdout.isatty() if interactive is None else interactive
        self.enabled = every > 0 or not interactive
        self.every = every
        self.total = total_steps
        self.world_size = world_size
        self.probe = probe
        self.path = path
        self.extra = extra  # more fields for steps.jsonl (the ranks' spread of step times)
        self.epoch = -1
        self.loss_sum = None
        self.losses = 0

    def __call__(self, done: StepDone) -> None:
        if not self.enabled:
            return
        if done.epoch != self.epoch:  # the probe's interval begins with the epoch's steps
            self.epoch = done.epoch
            self.loss_sum = None
            self.losses = 0
        loss = done.loss.float()
        self.loss_sum = loss if self.loss_sum is None else self.loss_sum + loss
        self.losses = self.losses + 1
        due = (done.step % self.every == 0 if self.every else
               self.probe.lap_s() >= AUTO_SECONDS)
        if due and done.step != self.probe.first_step:  # the job's first: no timed step yet
            self.log(done, self.probe.lap())
            self.loss_sum = None
            self.losses = 0

    def record(self, done: StepDone, lap: Lap) -> dict:
        loss = self.loss_sum.item() / self.losses  # the device is done: the lap waited
        return dict(epoch=done.epoch + 1, step=done.step, total_steps=self.total, loss=loss,
                    images_per_second=lap.images * self.world_size / lap.seconds,
                    eta_s=max(0, self.total - done.step) * lap.seconds / lap.steps,
                    peak_memory_gib=peak_memory_gib(self.probe.device),
                    elapsed_s=self.probe.elapsed_s(), **self.extra())

    def log(self, done: StepDone, lap: Lap) -> None:
        r = self.record(done, lap)
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
