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

Readers: the stall watchdog (the step and the phase, the `Activity` it watches), the
straggler check (each rank's own work and data wait per step), and the energy account
(the images trained). Per step: plain attribute writes and a few clock reads, no
syscall, no lock, no host synchronisation. On a GPU that the straggler check times
(`time_on_gpu`) the spans of own work are CUDA events, read once per log interval
(`busy_total_s`): the host runs ahead of a GPU, so a slow GPU would show in host time only
where something waits for it, mostly in backward's all-reduce, which is not own work.
"""

from __future__ import annotations

import time

import torch
import torch.nn as nn

from workload.training.watchdog import COMPUTE, DATA, OPTIMIZER, Activity


class StepProbe(Activity):
    """Where this rank's loop is (the watchdog's `Activity`), and what it measured."""

    __slots__ = ("busy_s", "data_s", "images", "on_gpu", "gpu_spans", "hooked",
                 "_fetching", "_forward", "_backward", "_optimizer")

    def __init__(self, step: int = 0):
        super().__init__(step)
        self.busy_s = self.data_s = 0.0
        self.images = 0  # this job's, on this rank
        self.on_gpu, self.gpu_spans, self.hooked = False, [], False
        self._fetching = time.perf_counter()
        self._forward = self._backward = self._optimizer = None

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
        self.phase, self._fetching = DATA, time.perf_counter()

    def data_ready(self) -> None:
        self.data_s += time.perf_counter() - self._fetching

    def forward_start(self) -> None:
        if not self.hooked:  # one mark a step: on a GPU each is an event
            self._forward = self.mark()
        self.phase = COMPUTE

    def backward_start(self) -> None:
        self._backward = self.mark()

    def optimizer_start(self) -> None:
        self.phase, self._optimizer = OPTIMIZER, self.mark()

    def step_end(self, step: int, images: int) -> None:
        """Own work: the step less backward, where DDP waits for the other ranks."""
        self.step, self.images = step, self.images + images
        self.add_busy(self._forward, self._backward)
        self.add_busy(self._optimizer, self.mark())

    def enter(self, phase: str) -> str:
        """A phase outside the step; the one it replaces (to go back to)."""
        before, self.phase = self.phase, phase
        return before

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
