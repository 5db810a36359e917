"""Slow ranks, named (docs/hangs.md#a-slow-rank): a contributor to the log interval's
exchange (workload.training.interval) on every rank.

Each interval the ranks exchange two numbers: their mean busy time per step (data, forward
and optimizer: the parts of a step with no collective in them, so a slow rank's own time,
not the time it makes the others wait) and their mean data wait. Rank 0 keeps the min,
median and max of each, with the rank of each, for the next line of steps.jsonl; a rank
more than SLOWER than the median of the other ranks for PATIENCE exchanges in a row gets
one warning naming it and its host. (The others', not everyone's: with two ranks the
median of both is their mean, and the slow rank would have to be 50 % slower than the
other to pass 20 % above it.) Both sums are the loop's probe's (workload.training.probe:
`busy_total_s`, `data_s`); on a GPU the busy spans are CUDA events, so a slow GPU is seen
where the host runs ahead of it. With one process there is no one to compare: the
numbers travel, nothing is judged.
"""

from __future__ import annotations

import statistics

import torch

from workload import distributed
from workload.launch.variables import node_name
from workload.logs import logger
from workload.training.probe import StepProbe

SLOWER = 0.20      # more than 20 % above the median busy time ...
PATIENCE = 3       # ... for this many exchanges in a row: the warning


def spread(values: list[float], name: str) -> dict:
    """min, median and max of one number over the ranks, with the rank of each."""
    order = sorted(range(len(values)), key=values.__getitem__)
    middle = order[len(order) // 2]
    return {f"{name}_min_s": values[order[0]], f"{name}_min_rank": order[0],
            f"{name}_median_s": statistics.median(values), f"{name}_median_rank": middle,
            f"{name}_max_s": values[order[-1]], f"{name}_max_rank": order[-1]}


def others_median(values: list[float], rank: int) -> float:
    return statistics.median(values[:rank] + values[rank + 1:])


def slow_ranks(busy: list[float]) -> list[bool]:
    """Whether each rank's busy time is more than SLOWER above the others' median."""
    return [value > (1 + SLOWER) * others_median(busy, rank) > 0
            for rank, value in enumerate(busy)]


class StragglerJudge:
    """The contributor: each rank's busy time and data wait per step of the interval;
    rank 0 judges them."""

    def __init__(self, probe: StepProbe, world_size: int, device: torch.device):
        self.probe = probe
        hosts = distributed.gather_objects({"host": node_name()}, world_size)
        self.hosts = [h["host"] for h in hosts]
        self.slow_for = [0] * world_size
        self.warned: set[int] = set()
        self.judging = world_size > 1
        if device.type == "cuda" and self.judging:
            probe.time_on_gpu()

    def start(self) -> None:
        self.busy0 = self.probe.busy_total_s()
        self.data0 = self.probe.data_s

    def numbers(self, steps: int) -> list[float]:
        busy0 = self.busy0
        data0 = self.data0
        self.start()
        return [(self.busy0 - busy0) / steps, (self.data0 - data0) / steps]

    def read(self, rows: list[list[float]], step: int) -> dict:
        if not self.judging:
            return {}
        return self.judge([row[0] for row in rows], [row[1] for row in rows], step)

    def judge(self, busy: list[float], data: list[float], step: int) -> dict:
        """Warn of a rank slow for PATIENCE intervals; the fields of steps.jsonl."""
        for rank, slow in enumerate(slow_ranks(busy)):
            self.slow_for[rank] = self.slow_for[rank] + 1 if slow else 0
            if self.slow_for[rank] >= PATIENCE and rank not in self.warned:
                self.warned.add(rank)
                self.warn(rank, busy, data[rank], step)
        return {**spread(busy, "step_busy"), **spread(data, "data_wait"),
                "step_busy_by_rank_s": busy}

    def warn(self, rank: int, busy: list[float], data_wait: float, step: int) -> None:
        value = busy[rank]
        median = others_median(busy, rank)
        logger.warning(
            f"rank {rank} on {self.hosts[rank]} is slow: {value * 1000:.0f} ms of its own "
            f"work per step against the other ranks' median of {median * 1000:.0f} ms "
            f"(+{(value / median - 1) * 100:.0f} %) for {PATIENCE} intervals, to step "
            f"{step}; data wait {data_wait * 1000:.0f} ms; everyone waits for it: check "
            "that node (doctor), or leave it out")
