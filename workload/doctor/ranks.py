"""Across ranks: the rank map gathered to every rank, an all-reduce bandwidth probe, and
which network NCCL chose for it.

Bandwidth follows nccl-tests (doc/PERFORMANCE.md): algbw = bytes / time, and for
all-reduce busbw = algbw * 2(n-1)/n, the rate each link must sustain in a ring, which
is comparable across world sizes and with the hardware's link speed.

NCCL names its network in its INFO log ("Using network IB", "via NET/Socket/0"). The doctor
turns that log on for its own run (NCCL_DEBUG=INFO into a private NCCL_DEBUG_FILE) unless
the user already set NCCL_DEBUG, then reads it back after the probe, and warns when NCCL
used TCP on a machine with a faster fabric it did not use.
"""

from __future__ import annotations

import os
import re
import socket
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.distributed as dist

from workload.distributed import DistInfo
from workload.doctor.findings import INFO, OK, WARN, Finding, cpu_ranges
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


# ---------------------------------------------------------------- the network NCCL chose
SYS_CLASS = Path("/sys/class")
# Slingshot NICs appear as cxi devices; InfiniBand (and RoCE) HCAs under infiniband.
FABRICS = {"infiniband": "InfiniBand", "cxi": "Slingshot"}
FABRIC_FIX = {
    "infiniband": "check NCCL_IB_DISABLE is unset, the container sees /dev/infiniband "
                  "(apptainer exec --nv binds it on most sites; docker run --device "
                  "/dev/infiniband --cap-add IPC_LOCK), and NCCL_IB_HCA if you set it",
    "cxi": "use the aws-ofi-nccl plugin: export NCCL_NET='AWS Libfabric' FI_PROVIDER=cxi "
           "and bind the site's plugin and libfabric into the container (jobs/ presets)",
}
NETWORK_LINE = re.compile(r"NCCL INFO Using network (.+?)\s*$")
CHANNEL_LINE = re.compile(r"NCCL INFO Channel .* via (.+?)\s*$")
OFI_PROVIDER = re.compile(r"NET/OFI Selected [Pp]rovider is (\w+)")


def fabric_devices(sys_class: Path = SYS_CLASS) -> dict[str, list[str]]:
    """Fabric devices the kernel shows, e.g. {"infiniband": ["mlx5_0"], "cxi": []}."""
    return {kind: sorted(p.name for p in (sys_class / kind).glob("*"))
            for kind in FABRICS if (sys_class / kind).is_dir()}


def transport_name(via: str) -> str:
    """"NET/IB/0/GDRDMA" -> "NET/IB", "P2P/CUMEM/read" -> "P2P", "SHM/direct/direct" -> "SHM"."""
    parts = via.split("/")
    return "/".join(parts[:2]) if parts[0] == "NET" and len(parts) > 1 else parts[0]


def parse_nccl_log(lines) -> dict:
    """The network and the per-channel transports named in NCCL INFO lines."""
    network = None
    provider = None
    transports = set()
    for line in lines:
        if match := NETWORK_LINE.search(line):
            network = match.group(1)
        elif match := CHANNEL_LINE.search(line):
            transports.add(transport_name(match.group(1)))
        if match := OFI_PROVIDER.search(line):
            provider = match.group(1)
    return dict(network=network, ofi_provider=provider, transports=sorted(transports))


NCCL_LOG_VARIABLES = ("NCCL_DEBUG", "NCCL_DEBUG_SUBSYS", "NCCL_DEBUG_FILE")


def capture_nccl_log(folder: Path, env=os.environ) -> Path | None:
    """Send this process's NCCL INFO log to a file we can read (not if the user chose one)."""
    if "NCCL_DEBUG" in env or "NCCL_DEBUG_FILE" in env:
        return None
    env["NCCL_DEBUG"] = "INFO"
    env["NCCL_DEBUG_SUBSYS"] = env.get("NCCL_DEBUG_SUBSYS", "INIT,NET")
    path = folder / f"nccl.{os.getpid()}.log"
    env["NCCL_DEBUG_FILE"] = str(path)
    return path


@contextmanager
def nccl_log_for_one_run(env=os.environ) -> Iterator[Path | None]:
    """capture_nccl_log into a private folder (0700, not the group-writable run folder:
    NCCL opens the file by its path) while one run lasts, then its variables removed; None
    where the user chose NCCL's log (NCCL_DEBUG or NCCL_DEBUG_FILE set)."""
    with tempfile.TemporaryDirectory(prefix="hpc-train-nccl-") as folder:
        before = {name: env.get(name) for name in NCCL_LOG_VARIABLES}
        path = capture_nccl_log(Path(folder), env)
        try:
            yield path
        finally:
            for name, value in before.items():
                if value is None:
                    env.pop(name, None)


def read_nccl_log(path: Path | None) -> dict:
    if path is None or not path.is_file():
        return dict(network=None, ofi_provider=None, transports=[])
    return parse_nccl_log(path.read_text(errors="replace").splitlines())


def uses_sockets(nccl: dict, num_nodes: int) -> bool:
    """Data really crosses TCP: a channel via NET/Socket, or the Socket network between nodes
    (within one node NCCL names a network but moves data over P2P or SHM)."""
    return "NET/Socket" in nccl.get("transports", []) or (
        nccl.get("network") == "Socket" and num_nodes > 1)


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
    if present and uses_sockets(nccl, num_nodes):
        kind = next(iter(present))
        return Finding("transport", WARN, detail + f": NCCL fell back to TCP sockets on a "
                       f"machine with {FABRICS[kind]}", FABRIC_FIX[kind])
    return Finding("transport", OK, detail)


def tcp_fallback_warning(backend: str | None, nccl_log: Path | None, num_nodes: int,
                         sys_class: Path = SYS_CLASS) -> str | None:
    """The transport check's warning (transport_finding: NCCL took TCP sockets on a node
    with a faster fabric) as one line for a training's log, else None."""
    finding = transport_finding(backend, read_nccl_log(nccl_log), fabric_devices(sys_class),
                                num_nodes)
    return f"{finding.detail}; {finding.fix}" if finding.status == WARN else None
