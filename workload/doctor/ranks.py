"""Across ranks: the rank map gathered to every rank, and an all-reduce bandwidth probe.

Bandwidth follows nccl-tests (doc/PERFORMANCE.md): algbw = bytes / time, and for
all-reduce busbw = algbw * 2(n-1)/n, the rate each link must sustain in a ring, which
is comparable across world sizes and with the hardware's link speed.
"""

from __future__ import annotations

import os
import socket
import time

import torch
import torch.distributed as dist

from workload.distributed import DistInfo


def cpu_ranges(cpus) -> str:
    """{0, 1, 2, 5} -> "0-2,5": the CPU binding as taskset and numactl print it."""
    cpus, parts = sorted(cpus), []
    for cpu in cpus:
        if parts and cpu == parts[-1][1] + 1:
            parts[-1][1] = cpu
        else:
            parts.append([cpu, cpu])
    return ",".join(f"{a}-{b}" if a != b else str(a) for a, b in parts)


def node_name() -> str:
    """SLURM's node name when there is one (several slurmd "nodes" may share a host)."""
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]


def my_place(info: DistInfo) -> dict:
    device = info.device
    return dict(
        rank=info.rank, local_rank=info.local_rank, node=node_name(),
        host=socket.gethostname(), pid=os.getpid(), device=str(device),
        device_name=torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU",
        cpus=cpu_ranges(os.sched_getaffinity(0)), cpu_list=sorted(os.sched_getaffinity(0)),
        threads=torch.get_num_threads(),
        cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"),
    )


def gather(obj, info: DistInfo) -> list:
    """Every rank's object, in rank order, on every rank (so all ranks agree on the verdict)."""
    if info.backend is None:
        return [obj]
    everyone = [None] * info.world_size
    dist.all_gather_object(everyone, obj)
    return everyone


def shared_devices(rank_map: list[dict]) -> list[str]:
    """GPUs that two ranks on one node both use: DDP then runs two processes on one GPU."""
    owners: dict[tuple, list[int]] = {}
    for place in rank_map:
        if place["device"].startswith("cuda"):
            key = (place["node"], place["cuda_visible_devices"], place["device"])
            owners.setdefault(key, []).append(place["rank"])
    return [f"{node} {device}: ranks {ranks}" for (node, _, device), ranks in owners.items()
            if len(ranks) > 1]


def crowded_nodes(rank_map: list[dict]) -> list[str]:
    """Nodes where several ranks' threads together outnumber the CPUs they are bound to
    (one rank alone is the local threads check's business)."""
    nodes: dict[str, tuple[int, int, set]] = {}
    for place in rank_map:
        count, threads, cpus = nodes.get(place["node"], (0, 0, set()))
        nodes[place["node"]] = (count + 1, threads + place["threads"],
                                cpus | set(place["cpu_list"]))
    return [f"{node}: {threads} threads on {len(cpus)} CPUs"
            for node, (count, threads, cpus) in nodes.items()
            if count > 1 and threads > len(cpus)]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)  # GPU-only line


def allreduce_probe(info: DistInfo, megabytes: float, iterations: int, warmup: int = 2) -> dict:
    """Time all-reduce of a float32 buffer; the slowest rank's time counts (as in nccl-tests)."""
    elements = max(1, int(megabytes * 2**20) // 4)
    buffer = torch.ones(elements, dtype=torch.float32, device=info.device)
    for _ in range(warmup):  # connection setup and NCCL channel creation happen here
        dist.all_reduce(buffer)
    _sync(info.device)
    dist.barrier()
    started = time.perf_counter()
    for _ in range(iterations):
        dist.all_reduce(buffer)
    _sync(info.device)
    elapsed = torch.tensor([(time.perf_counter() - started) / iterations], dtype=torch.float64,
                           device=info.device)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    seconds, n = elapsed.item(), info.world_size
    size = elements * 4
    algbw = size / seconds / 1e9
    return dict(backend=info.backend, world_size=n, bytes=size, iterations=iterations,
                time_s=seconds, algbw_gbps=algbw, busbw_gbps=algbw * 2 * (n - 1) / n)


def allreduce_is_correct(info: DistInfo) -> bool:
    """Each rank contributes its rank number; the sum must be n(n-1)/2 on every rank."""
    value = torch.tensor([float(info.rank)], dtype=torch.float64, device=info.device)
    dist.all_reduce(value)
    return value.item() == info.world_size * (info.world_size - 1) / 2
