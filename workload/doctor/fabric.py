"""Which network NCCL chose, and whether the machine has a faster one it did not use.

NCCL names its choice in its INFO log ("Using network IB", "via NET/Socket/0"). The doctor
turns that log on for its own run (NCCL_DEBUG=INFO into a private NCCL_DEBUG_FILE) unless
the user already set NCCL_DEBUG, then reads it back after the all-reduce probe.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from workload.doctor.findings import INFO, OK, WARN, Finding

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
    network, provider, transports = None, None, set()
    for line in lines:
        if match := NETWORK_LINE.search(line):
            network = match.group(1)
        elif match := CHANNEL_LINE.search(line):
            transports.add(transport_name(match.group(1)))
        if match := OFI_PROVIDER.search(line):
            provider = match.group(1)
    return dict(network=network, ofi_provider=provider, transports=sorted(transports))


def capture_nccl_log(folder: Path, env=os.environ) -> Path | None:
    """Send this process's NCCL INFO log to a file we can read (not if the user chose one)."""
    if "NCCL_DEBUG" in env or "NCCL_DEBUG_FILE" in env:
        return None
    env["NCCL_DEBUG"] = "INFO"
    env["NCCL_DEBUG_SUBSYS"] = env.get("NCCL_DEBUG_SUBSYS", "INIT,NET")
    path = folder / f"nccl.{os.getpid()}.log"
    env["NCCL_DEBUG_FILE"] = str(path)
    return path


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
