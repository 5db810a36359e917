"""`doctor`'s sweep: all-reduce correctness on exact, known values and its bandwidth at
every size from 1 MiB to --sweep-max-mib (256 by default: faulty fabrics corrupt data
only at some sizes, Olivia's LL128 between 2 and 64 MB), and a matrix-multiply rate per
rank with Megatron's outlier rule (more than 10 % and more than one standard deviation
below the median), each slow rank named with its host.

The all-reduce is passed in (`all_reduce(tensor)`, in place), so a unit test can inject a
fault in a test double of the communication layer.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch

from workload.doctor.findings import FAIL, OK, WARN, Finding

MATMUL_SIDE = 512
MATMUL_REPEATS = 3
SLOWER_THAN_MEDIAN = 0.10


def sweep_sizes(max_mib: float) -> list[int]:
    """1, 2, 4, ... MiB up to `max_mib` (none for 0)."""
    sizes = []
    size = 1
    while size <= max_mib:
        sizes.append(size)
        size *= 2
    return sizes


def pattern(rank: int, elements: int, device) -> torch.Tensor:
    """Whole numbers, exact in float32 when summed over any number of ranks below 2^18:
    element i of rank r is (i % 7 + 1) * (r % 8 + 1)."""
    return (torch.arange(elements, device=device) % 7 + 1).float() * float(rank % 8 + 1)


def expected(world_size: int, elements: int, device) -> torch.Tensor:
    weight = sum(r % 8 + 1 for r in range(world_size))
    return (torch.arange(elements, device=device) % 7 + 1).float() * float(weight)


def allreduce_sweep(all_reduce: Callable[[torch.Tensor], object], rank: int,
                    world_size: int, sizes: list[int], device, sync=lambda: None) -> list[dict]:
    """Per size: the elements this rank got wrong, and the time of one all-reduce."""
    rows = []
    for mib in sizes:
        elements = mib * 2**20 // 4
        buffer = pattern(rank, elements, device)
        sync()
        started = time.perf_counter()
        all_reduce(buffer)
        sync()
        seconds = time.perf_counter() - started
        wrong = int((buffer != expected(world_size, elements, device)).sum().item())
        busbw = mib * 2**20 / seconds / 1e9 * 2 * (world_size - 1) / max(1, world_size)
        rows.append(dict(mib=mib, wrong=wrong, time_s=seconds, busbw_gbps=busbw))
    return rows


def matmul_rate(device, sync=lambda: None) -> float:
    """GFLOP/s of a float32 matmul on this rank's device (the best of a few)."""
    a = torch.randn(MATMUL_SIDE, MATMUL_SIDE, device=device)
    best = float("inf")
    for _ in range(MATMUL_REPEATS):
        sync()
        started = time.perf_counter()
        a @ a
        sync()
        best = min(best, time.perf_counter() - started)
    return 2 * MATMUL_SIDE**3 / best / 1e9


def outliers(rates: list[float]) -> list[int]:
    """Indices (ranks, or pairs) of rates more than 10 % and more than one standard
    deviation below the median (of three or more: of two, neither is the odd one out)."""
    if len(rates) < 3:
        return []
    median = statistics.median(rates)
    spread = statistics.pstdev(rates)
    return [index for index, rate in enumerate(rates)
            if rate < median * (1 - SLOWER_THAN_MEDIAN) and rate < median - spread]


def sweep_finding(rows_by_rank: list[list[dict]], hosts: list[str]) -> Finding:
    """Wrong sums at any size fail, naming the sizes and the ranks that saw them."""
    bad = [(rank, row["mib"]) for rank, rows in enumerate(rows_by_rank) for row in rows
           if row["wrong"]]
    sizes = sorted({row["mib"] for rows in rows_by_rank for row in rows})
    if bad:
        where = ", ".join(f"rank {rank} ({hosts[rank]}) at {mib} MiB" for rank, mib in bad)
        return Finding("allreduce-sweep", FAIL, f"all-reduce returned wrong values: {where}",
                       "a faulty link or NCCL protocol: rerun with NCCL_PROTO=^LL128 and "
                       "exclude the named nodes one by one (sbatch --exclude)")
    slowest = min((row["busbw_gbps"] for rows in rows_by_rank for row in rows), default=0.0)
    return Finding("allreduce-sweep", OK, f"exact sums at {', '.join(map(str, sizes))} MiB; "
                   f"lowest busbw {slowest:.2f} GB/s")


def matmul_finding(rates: list[float], hosts: list[str]) -> Finding:
    slow = outliers(rates)
    median = statistics.median(rates) if rates else 0.0
    if slow:
        named = ", ".join(f"rank {r} on {hosts[r]} ({rates[r]:.1f} GFLOP/s)" for r in slow)
        return Finding("matmul-rate", WARN, f"slow: {named}; median {median:.1f} GFLOP/s",
                       "a throttled or faulty GPU slows every rank: check its clocks and "
                       "temperature (nvidia-smi -q -d CLOCK,TEMPERATURE) or exclude the node")
    return Finding("matmul-rate", OK, f"{len(rates)} rank(s), median {median:.1f} GFLOP/s")
