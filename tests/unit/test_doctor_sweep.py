"""doctor's sweep with a fault injected in a test double of the communication layer: the
all-reduce corrupts data only between 2 and 64 MiB on one rank (as LL128 did on Olivia),
and the sweep names the rank, its host and the sizes; the matmul outlier rule."""

from __future__ import annotations

import torch

from workload.doctor import sweep
from workload.doctor.findings import FAIL, OK, WARN

HOSTS = ["nid001", "nid001", "nid002", "nid002"]


def faulty_all_reduce(rank: int, world_size: int, bad_rank: int | None):
    """The sum every rank would get, computed locally; wrong on `bad_rank` from 2 MiB on."""
    def all_reduce(tensor: torch.Tensor) -> None:
        tensor.copy_(sweep.expected(world_size, tensor.numel(), tensor.device))
        if rank == bad_rank and 2 * 2**20 <= tensor.numel() * 4 <= 64 * 2**20:
            tensor[12345] += 1.0  # one flipped value in millions
    return all_reduce


def sweep_all(bad_rank: int | None) -> list[list[dict]]:
    return [sweep.allreduce_sweep(faulty_all_reduce(rank, 4, bad_rank), rank, 4,
                                  sweep.sweep_sizes(4), "cpu") for rank in range(4)]


def test_sizes_double_from_one_mib():
    assert sweep.sweep_sizes(256) == [1, 2, 4, 8, 16, 32, 64, 128, 256]
    assert sweep.sweep_sizes(0) == []


def test_a_corrupting_rank_is_named_with_its_host_and_sizes():
    finding = sweep.sweep_finding(sweep_all(bad_rank=2), HOSTS)
    assert finding.status == FAIL
    assert "rank 2 (nid002) at 2 MiB" in finding.detail
    assert "rank 2 (nid002) at 4 MiB" in finding.detail and "1 MiB" not in finding.detail
    assert "rank 0" not in finding.detail


def test_exact_sums_pass():
    finding = sweep.sweep_finding(sweep_all(bad_rank=None), HOSTS)
    assert finding.status == OK and "1, 2, 4 MiB" in finding.detail


def test_the_pattern_sums_exactly_in_float32():
    total = sum(sweep.pattern(rank, 100, "cpu") for rank in range(1000))
    assert torch.equal(total, sweep.expected(1000, 100, "cpu"))


def test_a_slow_rank_is_10_percent_and_one_deviation_below_the_median():
    assert sweep.outliers([100.0, 101.0, 99.0, 100.0, 80.0]) == [4]
    assert sweep.outliers([100.0, 95.0, 100.0, 100.0]) == []  # 5 %: within the rule
    assert sweep.outliers([100.0, 50.0]) == []  # of two, neither is the odd one out
    finding = sweep.matmul_finding([100.0, 101.0, 99.0, 70.0], HOSTS)
    assert finding.status == WARN and "rank 3 on nid002" in finding.detail
