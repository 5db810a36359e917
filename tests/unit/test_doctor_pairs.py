"""doctor's sweep on every rank pair: the round schedule, a fault injected in a test double
of the communication layer (one pair corrupts at one size, as a bad link under LL128
does) named with both ranks and hosts, and the slow-pair rule."""

from __future__ import annotations

import itertools

import torch

from workload.doctor import pairs, sweep
from workload.doctor.findings import FAIL, OK, WARN

HOSTS = ["nid001", "nid001", "nid002", "nid002"]


class FaultyPairs:
    """The communication layer of one rank, computed locally: a pair's sum is what two
    honest ranks give, except on `bad_pair` at `bad_mib`, seen by its higher rank."""

    def __init__(self, rank: int, bad_pair: tuple[int, int] | None, bad_mib: int = 2):
        self.rank, self.bad_pair, self.bad_mib, self.released = rank, bad_pair, bad_mib, 0

    def group(self, round_pairs):
        return next((p for p in round_pairs if self.rank in p), None)

    def all_reduce(self, tensor: torch.Tensor, group) -> None:
        tensor.copy_(sweep.expected(2, tensor.numel(), tensor.device))
        if (group == self.bad_pair and self.rank == max(group)
                and tensor.numel() * 4 == self.bad_mib * 2**20):
            tensor[4321] -= 1.0

    def release(self, group) -> None:
        self.released += 1


def sweep_every_rank(bad_pair, world_size=4, max_rounds=None) -> list[list[list]]:
    return [pairs.pair_sweep(FaultyPairs(rank, bad_pair), rank, world_size,
                             sweep.sweep_sizes(2), max_rounds, "cpu")
            for rank in range(world_size)]


def test_rounds_cover_every_pair_once_with_disjoint_pairs():
    for world_size in range(2, 10):
        schedule = pairs.rounds(world_size)
        assert len(schedule) == (world_size - 1 if world_size % 2 == 0 else world_size)
        every = [pair for one_round in schedule for pair in one_round]
        assert sorted(every) == list(itertools.combinations(range(world_size), 2))
        for one_round in schedule:
            ranks = [rank for pair in one_round for rank in pair]
            assert len(ranks) == len(set(ranks)) == world_size - world_size % 2
    assert pairs.rounds(1) == []


def test_the_corrupting_pair_alone_is_named_with_both_hosts_and_the_size():
    swept = sweep_every_rank(bad_pair=(1, 2))
    corrupt, bandwidth = pairs.pair_findings(swept, HOSTS, [1, 2], None, 0.5)
    assert corrupt.status == FAIL
    assert corrupt.detail.endswith(": ranks 1 (nid001) and 2 (nid002) at 2 MiB"), corrupt
    assert "NCCL_PROTO=^LL128" in corrupt.fix
    assert bandwidth.check == "pair-bandwidth"


def test_exact_sums_on_every_pair_pass_and_say_what_was_covered():
    corrupt, _ = pairs.pair_findings(sweep_every_rank(None), HOSTS, [1, 2], None, 0.5)
    assert corrupt.status == OK
    assert "6 of 6 pairs in 3 of 3 rounds at 1, 2 MiB" in corrupt.detail


def test_pair_rounds_bounds_the_sweep():
    swept = sweep_every_rank(None, world_size=5, max_rounds=2)
    assert sum(len(mine) for mine in swept) == 2 * 2 * 2  # 2 rounds of 2 pairs, both sides
    corrupt, _ = pairs.pair_findings(swept, ["n"] * 5, [1], 2, 0.1)
    assert "4 of 10 pairs in 2 of 5 rounds" in corrupt.detail


def test_a_slow_pair_is_named_among_pairs_of_its_kind_only():
    hosts = ["a", "a", "b", "b", "c", "c"]
    speeds = {pair: (40.0 if hosts[pair[0]] == hosts[pair[1]] else 10.0)
              for pair in itertools.combinations(range(6), 2)}
    speeds[(1, 4)] = 5.0
    by_rank = [[[b if a == rank else a, speed, []] for (a, b), speed in speeds.items()
                if rank in (a, b)] for rank in range(6)]
    finding = pairs.bandwidth_finding(pairs.merge(by_rank), hosts)
    # The fast same-node pairs do not make every pair across nodes look slow.
    assert finding.status == WARN and "ranks 1 (a) and 4 (c) (5.00 GB/s)" in finding.detail
    assert finding.detail.count("GB/s") == 1, finding.detail  # that pair alone


def test_too_few_pairs_of_a_kind_are_not_judged():
    results = [pairs.PairResult((0, 2), 10.0, ()), pairs.PairResult((1, 3), 1.0, ()),
               pairs.PairResult((0, 3), 10.0, ())]
    assert pairs.bandwidth_finding(results, HOSTS).status == OK
