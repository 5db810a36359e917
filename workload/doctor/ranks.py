"""Across ranks: the rank map gathered to every rank, an all-reduce bandwidth probe, and
which network NCCL chose for it.

Bandwidth follows nccl-tests (doc/PERFORMANCE.md): algbw = bytes / time, and for
all-reduce busbw = algbw * 2(n-1)/n, the rate each link must sustain in a ring, which
is comparable across world sizes and with the hardware's link speed.

The network NCCL chose: its INFO log, read as workload/launch/nccl_net.py reads it (the
one home `train` shares), turned into the doctor's finding, a warning when NCCL used TCP
on a machine with a faster fabric it did not use.
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import torch
import torch.distributed as dist

from workload.distributed import DistInfo
from workload.doctor.findings import INFO, OK, WARN, Finding, cpu_ranges
from workload.launch.nccl_net import FABRIC_FIX, FABRICS, fallback_fabric
from workload.launch.variables import node_name


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


def free_bytes(device: torch.device) -> int | None:
    """The memory a buffer on `device` can take now: the GPU's free memory, or the node's
    available memory (MemAvailable) for the CPU; None when unknown."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def probe_buffer(info: DistInfo, megabytes: float) -> torch.Tensor | None:
    """The probe's float32 buffer on every rank, or None on every rank when it does not
    fit on one of them (more than its free memory, the CPU ranks of a node sharing it, or
    an allocation that failed): decided together, so no rank enters an all-reduce that
    the others skip."""
    elements = max(1, int(megabytes * 2**20) // 4)
    free = free_bytes(info.device)
    sharing = info.local_world_size if info.device.type == "cpu" else 1
    buffer = None
    if free is None or elements * 4 * sharing <= free:
        try:
            buffer = torch.ones(elements, dtype=torch.float32, device=info.device)
        except (RuntimeError, MemoryError):  # torch's out-of-memory errors are RuntimeErrors
            buffer = None
    everyone = torch.tensor([int(buffer is not None)], device=info.device)
    dist.all_reduce(everyone, op=dist.ReduceOp.MIN)
    return buffer if everyone.item() else None


def allreduce_probe(info: DistInfo, buffer: torch.Tensor, iterations: int,
                    warmup: int = 2) -> dict:
    """Time all-reduce of `buffer`; the slowest rank's time counts (as in nccl-tests)."""
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
    seconds = elapsed.item()
    n = info.world_size
    size = buffer.numel() * 4
    algbw = size / seconds / 1e9
    return dict(backend=info.backend, world_size=n, bytes=size, iterations=iterations,
                time_s=seconds, algbw_gbps=algbw, busbw_gbps=algbw * 2 * (n - 1) / n)


def allreduce_is_correct(info: DistInfo) -> bool:
    """Each rank contributes its rank number; the sum must be n(n-1)/2 on every rank."""
    value = torch.tensor([float(info.rank)], dtype=torch.float64, device=info.device)
    dist.all_reduce(value)
    return value.item() == info.world_size * (info.world_size - 1) / 2


def transport_finding(backend: str | None, nccl: dict, devices: dict, num_nodes: int,
                      env=os.environ) -> Finding:
    """The chosen transport, and a warning when NCCL uses TCP next to a faster fabric."""
    present = {kind: names for kind, names in devices.items() if names}
    seen = ", ".join(f"{FABRICS[k]} ({', '.join(v)})" for k, v in present.items()) or "none"
    if backend is None:
        return Finding("transport", INFO, f"one process: no collective; fabric devices: {seen}")
    if backend == "gloo":
        return Finding("transport", INFO, f"gloo over TCP (the CPU path); fabric devices: "
                       f"{seen}" + ("; NCCL on GPUs uses them" if present else ""))
    network = nccl.get("network") or env.get("NCCL_NET") or "unknown (NCCL_DEBUG set by you)"
    detail = (f"NCCL network {network}" + (f" (OFI provider {nccl['ofi_provider']})"
              if nccl.get("ofi_provider") else "") + f", channels via "
              f"{', '.join(nccl.get('transports') or ['?'])}; fabric devices: {seen}")
    kind = fallback_fabric(nccl, devices, num_nodes)
    if kind:
        return Finding("transport", WARN, detail + f": NCCL fell back to TCP sockets on a "
                       f"machine with {FABRICS[kind]}", FABRIC_FIX[kind])
    return Finding("transport", OK, detail)

