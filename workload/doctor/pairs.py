"""`doctor`'s sweep on every rank pair: all-reduce correctness and bandwidth between two
ranks at a time, where a faulty link or NCCL protocol corrupts (Olivia's LL128 between 2
and 64 MB) without the all-rank sweep seeing the same path.

The pairs run in rounds of disjoint pairs (the circle schedule of a round-robin
tournament: N-1 rounds for an even N, N rounds with one rank idle in each for an odd N),
every pair of a round at the same time in its own 2-rank process group. Every rank
creates every group of a round, in the same order (torch numbers groups in creation
order; Megatron's parallel_state builds its groups the same way), through
new_subgroups_by_enumeration, and gives its own group back after the round, so no rank
holds more than one pair's communicator at a time.

The communication layer is passed in (`PairComm`), so a unit test can inject a fault in a
test double; rank 0 judges the pairs from what every rank gathered.
"""

from __future__ import annotations

import functools
import statistics
import time
from dataclasses import dataclass

import torch

from workload.doctor.findings import FAIL, OK, WARN, Finding
from workload.doctor.sweep import SLOWER_THAN_MEDIAN, allreduce_sweep, outliers

MIN_PAIRS_TO_COMPARE = 4  # of fewer pairs of a kind, one slow link moves the median itself
MOST_NAMED = 12


def rounds(world_size: int) -> list[list[tuple[int, int]]]:
    """Rounds of disjoint pairs covering every pair once (the circle method): rank 0 stays
    put, the others rotate; with an odd count a phantom rank makes its partner idle."""
    if world_size < 2:
        return []
    n = world_size + world_size % 2
    others = list(range(1, n))
    schedule = []
    for turn in range(n - 1):
        ring = [0] + others[turn:] + others[:turn]
        pairs = [tuple(sorted((ring[i], ring[n - 1 - i]))) for i in range(n // 2)]
        schedule.append([p for p in pairs if p[1] < world_size])
    return schedule


class PairComm:
    """torch.distributed: one 2-rank group per pair of a round, created by every rank."""

    def group(self, pairs: list[tuple[int, int]]):
        import torch.distributed as dist
        mine, _ = dist.new_subgroups_by_enumeration([list(pair) for pair in pairs])
        return mine

    def all_reduce(self, tensor: torch.Tensor, group) -> None:
        torch.distributed.all_reduce(tensor, group=group)

    def release(self, group) -> None:
        import torch.distributed as dist
        if group is not None and group != dist.GroupMember.NON_GROUP_MEMBER:
            dist.destroy_process_group(group)


def pair_sweep(comm, rank: int, world_size: int, sizes: list[int], max_rounds: int | None,
               device, sync=lambda: None) -> list[list]:
    """This rank's pairs: [peer, busbw at the largest size (GB/s), sizes with wrong values]."""
    mine = []
    for pairs in rounds(world_size)[:max_rounds]:
        group = comm.group(pairs)
        pair = next((p for p in pairs if rank in p), None)
        if pair is not None:
            reduce = functools.partial(comm.all_reduce, group=group)
            reduce(torch.zeros(1, device=device))  # connection set-up (NCCL: comm init)
            rows = allreduce_sweep(reduce, pair.index(rank), 2, sizes, device, sync)
            peer = pair[1 - pair.index(rank)]
            mine.append([peer, rows[-1]["busbw_gbps"], [r["mib"] for r in rows if r["wrong"]]])
        comm.release(group)
    return mine


@dataclass(frozen=True)
class PairResult:
    ranks: tuple[int, int]
    busbw_gbps: float          # the slower side's, as nccl-tests counts the slowest rank
    wrong_mib: tuple[int, ...]  # sizes where either rank got a wrong value


def merge(pairs_by_rank: list[list[list]]) -> list[PairResult]:
    """Both ranks' view of each pair as one result, in rank order."""
    merged: dict[tuple[int, int], tuple[float, set]] = {}
    for rank, pairs in enumerate(pairs_by_rank):
        for peer, busbw, wrong in pairs:
            key = (min(rank, peer), max(rank, peer))
            slowest, bad = merged.get(key, (float("inf"), set()))
            merged[key] = (min(slowest, busbw), bad | set(wrong))
    return [PairResult(key, busbw, tuple(sorted(bad)))
            for key, (busbw, bad) in sorted(merged.items())]


def named(pair: tuple[int, int], hosts: list[str]) -> str:
    a, b = pair
    return f"ranks {a} ({hosts[a]}) and {b} ({hosts[b]})"


def listed(items: list[str]) -> str:
    more = len(items) - MOST_NAMED
    return "; ".join(items[:MOST_NAMED]) + (f"; and {more} more" if more > 0 else "")


def corrupt_finding(results: list[PairResult], hosts: list[str], summary: str) -> Finding:
    """Wrong values between any two ranks fail, naming both with their hosts and sizes."""
    bad = [f"{named(r.ranks, hosts)} at {', '.join(map(str, r.wrong_mib))} MiB"
           for r in results if r.wrong_mib]
    if bad:
        return Finding("pair-sweep", FAIL, "all-reduce between two ranks returned wrong "
                       f"values: {listed(bad)}",
                       "a faulty link or NCCL protocol: rerun with NCCL_PROTO=^LL128 and "
                       "exclude the named nodes (sbatch --exclude)")
    return Finding("pair-sweep", OK, f"exact sums: {summary}")


def slow_pairs(results: list[PairResult], hosts: list[str]) -> list[PairResult]:
    """Megatron's rule within each kind of pair (same node, across nodes: NVLink and the
    network differ by design), only where a kind has enough pairs to compare."""
    slow = []
    for same_node in (True, False):
        kind = [r for r in results if (hosts[r.ranks[0]] == hosts[r.ranks[1]]) == same_node]
        if len(kind) >= MIN_PAIRS_TO_COMPARE:
            slow += [kind[i] for i in outliers([r.busbw_gbps for r in kind])]
    return sorted(slow, key=lambda r: r.ranks)


def bandwidth_finding(results: list[PairResult], hosts: list[str]) -> Finding:
    slow = slow_pairs(results, hosts)
    median = statistics.median(r.busbw_gbps for r in results) if results else 0.0
    if slow:
        items = [f"{named(r.ranks, hosts)} ({r.busbw_gbps:.2f} GB/s)" for r in slow]
        return Finding("pair-bandwidth", WARN, f"slow pairs, more than "
                       f"{SLOWER_THAN_MEDIAN:.0%} and one deviation below the median of "
                       f"their kind (same node or across nodes): {listed(items)}",
                       "a rank in every slow pair points to its node's link or NIC: "
                       "check it (ibstat, NCCL_DEBUG=INFO) or exclude the node")
    return Finding("pair-bandwidth", OK, f"{len(results)} pairs, median busbw "
                   f"{median:.2f} GB/s at the largest size")


def pair_findings(pairs_by_rank: list[list[list]], hosts: list[str], sizes: list[int],
                  max_rounds: int | None, seconds: float) -> list[Finding]:
    """The corruption and bandwidth findings, with what the sweep covered and its cost."""
    results = merge(pairs_by_rank)
    schedule = rounds(len(hosts))
    summary = (f"{len(results)} of {len(hosts) * (len(hosts) - 1) // 2} pairs in "
               f"{len(schedule[:max_rounds])} of {len(schedule)} rounds at "
               f"{', '.join(map(str, sizes))} MiB, {seconds:.1f} s")
    return [corrupt_finding(results, hosts, summary), bandwidth_finding(results, hosts)]


def timed_pair_sweep(comm, rank, world_size, sizes, max_rounds, device, sync) -> dict:
    """pair_sweep, and the seconds it took this rank (rank 0 reports the longest)."""
    started = time.perf_counter()
    pairs = pair_sweep(comm, rank, world_size, sizes, max_rounds, device, sync)
    return dict(pairs=pairs, pair_seconds=time.perf_counter() - started)
