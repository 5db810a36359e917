"""The loop's one probe: the training loop calls a `StepProbe` at a few named points of
each step, and what measures the loop reads it instead of the loop writing to each.

    step_start        the loop waits for its next batch (phase "data wait")
    data_ready        the batch is there: the wait is added to the data time
    forward_start     the forward pass begins (phase "forward/backward"); under DDP the
                      module's forward pre-hook marks it instead, after DDP's broadcast
                      of rank 0's buffers, a wait for the slowest rank
    backward_start    the backward pass begins (DDP's all-reduce runs inside it)
    optimizer_start   the optimizer's step begins (phase "optimizer")
    step_end          the step is done: its count, its images, its own-work spans
    enter(phase)      a phase outside the step: checkpoint, collective, evaluation
    open_window       an epoch's steps begin
    close_window      they end: the epoch's `Window` (images, seconds, first step)
    lap               the progress line's interval ends, the next begins: its `Lap`

The probe is also the one clock of a step's throughput: the window of an epoch counts the
images of its steps and their seconds, with this job's first step left out (its warm-up
and compilation, `first_step_s`, timed apart from the images per second). The window
starts where the first step's hooks are done (at the next `step_start`), and the device
is synchronised once at the first step's end (what the start-up clock reads too,
workload.training.startup) and once where a window closes. The progress line's interval
(a `Lap`, workload.training.progress) is timed the same way within the epoch's window:
from the window's start or the last line's `lap`, synchronised where it ends.

Readers: the stall watchdog (the step and the phase, the `Activity` it watches), the
straggler check (each rank's own work and data wait per step), the energy account
(the images trained) and the loop's epoch statistics (the window). Per step, but the
job's first: plain attribute writes and a few clock reads, no syscall, no lock, no host
synchronisation. On a GPU that the straggler check times
(`time_on_gpu`) the spans of own work are CUDA events, read once per log interval
(`busy_total_s`): the host runs ahead of a GPU, so a slow GPU would show in host time only
where something waits for it, mostly in backward's all-reduce, which is not own work.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.nn as nn

from workload.training.watchdog import COLLECTIVE, COMPUTE, DATA, OPTIMIZER, Activity


def sync(device: torch.device | None) -> None:
    """Wait for the device (a GPU runs behind the host) before the clock is read."""
    if device is not None and device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass(frozen=True)
class Window:
    """An epoch's steps as the probe timed them (this rank's images)."""
    images: int                 # of the steps in the window: the job's first step left out
    seconds: float              # the window: from the first step's hooks done (or the
                                # epoch's start) to the last step's hooks done
    epoch_s: float              # the whole epoch's steps, the first step included
    first_step_s: float | None  # this job's first step and its hooks, if in this epoch


@dataclass(frozen=True)
class Lap:
    """The steps since the last progress line (or the epoch window's start), as the probe
    timed them: the job's first step left out, as from the window."""
    steps: int
    images: int                 # this rank's
    seconds: float


class StepProbe(Activity):
    """Where this rank's loop is (the watchdog's `Activity`), and what it measured.
    `step`: where this job starts (its first step is the next); `device`: the one the
    clock waits for."""

    __slots__ = ("busy_s", "data_s", "images", "on_gpu", "gpu_spans", "hooked",
                 "_fetching", "_forward", "_backward", "_optimizer", "device", "first_step",
                 "_epoch_start", "_window_start", "_window_images", "_first_step_s",
                 "_warm_up_ends", "_started", "_lap_start", "_lap_steps", "_lap_images")

    def __init__(self, step: int = 0, device: torch.device | None = None):
        super().__init__(step)
        self.busy_s = self.data_s = 0.0
        self.images = 0  # this job's, on this rank
        self.on_gpu = False
        self.gpu_spans = []
        self.hooked = False
        self._forward = self._backward = self._optimizer = None
        self.device = device
        self._warm_up_ends = False
        self.begin(step)

    def begin(self, step: int) -> None:
        """This job's loop starts after `step` (a resumed job's: its checkpoint's), its
        clocks now: a probe made before the resume (the energy account's, which counts
        from before the model is built) begins again once the step is known. This job's
        first step is timed apart (first_step_s), never counted into the images per
        second: its warm-up and compilation."""
        self.step = step
        self.first_step = step + 1
        self._fetching = self._started = time.perf_counter()
        self.open_window()

    def time_on_gpu(self) -> None:
        self.on_gpu = True

    def watch_forward(self, model: nn.Module) -> None:
        """Under DDP, forward starts where the wrapped module's forward does."""
        inner = getattr(model, "module", None)
        if isinstance(inner, nn.Module):
            inner.register_forward_pre_hook(self._forward_hook)
            self.hooked = True

    def _forward_hook(self, *_) -> None:
        self._forward = self.mark()

    # --- the loop's points -------------------------------------------------------
    def step_start(self) -> None:
        self.phase = DATA
        self._fetching = time.perf_counter()
        if self._warm_up_ends:  # the job's first step and its hooks are done
            self._warm_up_ends = False
            self._window_start = self._lap_start = self._fetching
            self._first_step_s = self._fetching - self._epoch_start

    def data_ready(self) -> None:
        self.data_s += time.perf_counter() - self._fetching

    def forward_start(self) -> None:
        if not self.hooked:  # one mark a step: on a GPU each is an event
            self._forward = self.mark()
        self.phase = COMPUTE

    def backward_start(self) -> None:
        self._backward = self.mark()

    def optimizer_start(self) -> None:
        self.phase = OPTIMIZER
        self._optimizer = self.mark()

    def step_end(self, step: int, images: int) -> None:
        """Own work: the step less backward, where DDP waits for the other ranks."""
        self.step = step
        self.images = self.images + images
        self.add_busy(self._forward, self._backward)
        self.add_busy(self._optimizer, self.mark())
        if step == self.first_step:  # the one wait in a step, once a job: warm-up ends
            sync(self.device)
            self._warm_up_ends = True
        else:
            self._window_images += images
            self._lap_images += images
            self._lap_steps += 1

    def enter(self, phase: str) -> str:
        """A phase outside the step; the one it replaces (to go back to)."""
        before = self.phase
        self.phase = phase
        return before

    def open_window(self) -> None:
        self._epoch_start = self._window_start = self._lap_start = time.perf_counter()
        self._window_images = self._lap_images = self._lap_steps = 0
        self._first_step_s = None

    def close_window(self) -> Window:
        """The epoch's window, read after the device is done with its steps (a phase of
        its own: the epoch's collectives follow)."""
        self.enter(COLLECTIVE)
        sync(self.device)
        end = time.perf_counter()
        return Window(self._window_images, end - self._window_start, end - self._epoch_start,
                      self._first_step_s)

    def lap(self) -> Lap:
        """The progress line's interval, read after the device is done with its steps;
        the next one begins."""
        sync(self.device)
        end = time.perf_counter()
        lap = Lap(self._lap_steps, self._lap_images, end - self._lap_start)
        self._lap_start = end
        self._lap_steps = self._lap_images = 0
        return lap

    def lap_s(self) -> float:
        """Seconds of the progress line's interval so far (no wait for the device)."""
        return time.perf_counter() - self._lap_start

    def elapsed_s(self) -> float:
        """Seconds since the probe began (with the job's training)."""
        return time.perf_counter() - self._started

    # --- timing --------------------------------------------------------------------
    def mark(self):
        """Now, for one end of a span of own work: a clock reading, or a recorded event."""
        if not self.on_gpu:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def add_busy(self, start, end) -> None:
        if self.on_gpu:
            self.gpu_spans.append((start, end))
        else:
            self.busy_s += end - start

    def busy_total_s(self) -> float:
        """busy_s with the GPU's spans so far (this waits for the GPU to reach them)."""
        if self.gpu_spans:
            self.gpu_spans[-1][1].synchronize()
            self.busy_s += sum(a.elapsed_time(b) for a, b in self.gpu_spans) / 1000
            self.gpu_spans.clear()
        return self.busy_s
