"""The log interval's one exchange: every `interval` steps (--log-every, else AUTO_STEPS;
ranks must agree, so steps, not seconds) each rank's contributors put their few numbers
into one tiny all-gather, and on rank 0 each reads its own columns of every rank back into
fields of the next steps.jsonl line (`latest_record`, what the progress line reads).

The contributors: the straggler judge (workload.training.stragglers: each rank's busy
time and data wait per step) and the energy account (workload.training.energy: each
rank's energy of the interval). A contributor has

    start()            the first interval begins (with the training, not before)
    numbers(steps)     this rank's numbers of the interval of `steps` steps (the same count
                       on every rank)
    read(rows, step)   rank 0: every rank's numbers, in rank order: the fields it adds

A new measurement of the interval adds a contributor, not a collective of its own.
"""

from __future__ import annotations

from typing import Protocol

import torch

from workload import distributed
from workload.training.probe import StepProbe
from workload.training.trainer import StepDone
from workload.training.watchdog import COLLECTIVE

AUTO_STEPS = 100   # the exchange interval when --log-every is 0


class Contributor(Protocol):
    def start(self) -> None: ...

    def numbers(self, steps: int) -> list[float]: ...

    def read(self, rows: list[list[float]], step: int) -> dict: ...


class IntervalExchange:
    """The progress hook on every rank; `latest_record()` is what the next progress line
    of steps.jsonl adds (rank 0)."""

    def __init__(self, probe: StepProbe, interval: int, device: torch.device, is_main: bool,
                 contributors: list[Contributor]):
        self.probe = probe
        self.interval = interval or AUTO_STEPS
        self.device = device
        self.is_main = is_main
        self.contributors = contributors
        self.latest: dict = {}
        for contributor in contributors:
            contributor.start()
        self.step0 = probe.step

    def latest_record(self) -> dict:
        return self.latest

    def __call__(self, done: StepDone) -> None:
        if done.step % self.interval or done.step == self.step0:
            return
        steps = done.step - self.step0
        self.step0 = done.step
        phase = self.probe.enter(COLLECTIVE)
        parts = [contributor.numbers(steps) for contributor in self.contributors]
        every = distributed.all_gather_floats([n for part in parts for n in part],
                                              self.device)
        self.probe.enter(phase)
        if not self.is_main:
            return
        latest = {}
        first = 0
        for contributor, part in zip(self.contributors, parts):
            columns = slice(first, first + len(part))
            latest.update(contributor.read([row[columns] for row in every], done.step))
            first += len(part)
        self.latest = latest
