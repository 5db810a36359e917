"""Slow ranks, named (docs/hangs.md#a-slow-rank): a trainer hook on every rank.

Every `interval` steps (--log-every, else AUTO_STEPS) the ranks exchange two numbers in
one tiny all-gather: their mean busy time per step (data, forward and optimizer: the
parts of a step with no collective in them, so a slow rank's own time, not the time it
makes the others wait) and their mean data wait. Rank 0 keeps the min, median and max of
each, with the rank of each, for the next line of steps.jsonl; a rank more than SLOWER
than the median for PATIENCE exchanges in a row gets one warning naming it and its host.
Both sums are the loop's probe's (workload.training.probe: `busy_total_s`, `data_s`); on
a GPU the busy spans are CUDA events, so a slow GPU is seen where the host runs ahead of
it.

The same exchange carries each rank's energy of the interval (workload.training.energy),
so the progress line's energy costs no collective of its own; with one process there is
no one to compare, and the exchange only reads the energy.
"""

from __future__ import annotations

import statistics

import torch

from workload import distributed
from workload.launch.variables import node_name
from workload.logs import logger
from workload.training.energy import EnergyAccount
from workload.training.trainer import StepDone
from workload.training.probe import StepProbe
from workload.training.watchdog import COLLECTIVE

AUTO_STEPS = 100   # the exchange interval when --log-every is 0 (ranks must agree: steps)
SLOWER = 0.20      # more than 20 % above the median busy time ...
PATIENCE = 3       # ... for this many exchanges in a row: the warning


def spread(values: list[float], name: str) -> dict:
    """min, median and max of one number over the ranks, with the rank of each."""
    order = sorted(range(len(values)), key=values.__getitem__)
    middle = order[len(order) // 2]
    return {f"{name}_min_s": values[order[0]], f"{name}_min_rank": order[0],
            f"{name}_median_s": statistics.median(values), f"{name}_median_rank": middle,
            f"{name}_max_s": values[order[-1]], f"{name}_max_rank": order[-1]}


class StragglerWatch:
    """The hook; `latest` is what the next progress line of steps.jsonl adds."""

    def __init__(self, probe: StepProbe, interval: int, world_size: int,
                 device: torch.device, is_main: bool, energy: EnergyAccount | None = None):
        self.probe, self.interval, self.device = probe, interval or AUTO_STEPS, device
        self.is_main = is_main
        hosts = distributed.gather_objects({"host": node_name()}, world_size)
        self.hosts = [h["host"] for h in hosts]
        self.slow_for = [0] * world_size
        self.warned: set[int] = set()
        self.latest: dict = {}
        self.energy, self.judging = energy, world_size > 1
        if device.type == "cuda" and self.judging:
            probe.time_on_gpu()
        if energy is not None:  # the first interval starts with the training, not before
            energy.interval(fresh=True)
        self._mark()

    def latest_record(self) -> dict:
        return self.latest

    def _mark(self) -> None:
        self.busy0, self.data0 = self.probe.busy_total_s(), self.probe.data_s
        self.step0 = self.probe.step

    def __call__(self, done: StepDone) -> None:
        if done.step % self.interval or done.step == self.step0:
            return
        steps = done.step - self.step0
        phase = self.probe.enter(COLLECTIVE)
        energy = self.energy.interval() if self.energy is not None else []
        every = distributed.all_gather_floats(
            [(self.probe.busy_total_s() - self.busy0) / steps,
             (self.probe.data_s - self.data0) / steps, *energy], self.device)
        self.probe.enter(phase)
        self._mark()
        if not self.is_main:
            return
        if self.judging:
            self.judge([row[0] for row in every], [row[1] for row in every], done.step)
        if self.energy is not None:
            self.latest.update(self.energy.interval_record([row[2:] for row in every]))

    def judge(self, busy: list[float], data: list[float], step: int) -> None:
        self.latest = {**spread(busy, "step_busy"), **spread(data, "data_wait"),
                       "step_busy_by_rank_s": busy}
        median = statistics.median(busy)
        for rank, value in enumerate(busy):
            slow = median > 0 and value > (1 + SLOWER) * median
            self.slow_for[rank] = self.slow_for[rank] + 1 if slow else 0
            if self.slow_for[rank] >= PATIENCE and rank not in self.warned:
                self.warned.add(rank)
                logger.warning(
                    f"rank {rank} on {self.hosts[rank]} is slow: {value * 1000:.0f} ms of "
                    f"its own work per step against a median of {median * 1000:.0f} ms "
                    f"(+{(value / median - 1) * 100:.0f} %) for {PATIENCE} intervals, to "
                    f"step {step}; data wait {data[rank] * 1000:.0f} ms; everyone waits "
                    "for it: check that node (doctor), or leave it out")
