"""Which network NCCL took, from its INFO log, against the fabric devices the node has:
the one home of the check `doctor` runs across ranks and `train` after its first step.

NCCL names its network in its INFO log ("Using network IB", "via NET/Socket/0"). A run
turns that log on into a private file (NCCL_DEBUG=INFO into NCCL_DEBUG_FILE) unless the
user already set NCCL_DEBUG or NCCL_DEBUG_FILE, reads it back once its collectives ran,
and says so when NCCL used TCP sockets on a node with a faster fabric it did not use.
The standard library and workload.held only (the bottom layer): no torch.
"""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from workload.held import fd_path

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


def capture_nccl_log(path: Path, env=os.environ) -> Path | None:
    """Send this process's NCCL INFO log to `path` (not if the user chose one)."""
    if "NCCL_DEBUG" in env or "NCCL_DEBUG_FILE" in env:
        return None
    env["NCCL_DEBUG"] = "INFO"
    env["NCCL_DEBUG_SUBSYS"] = env.get("NCCL_DEBUG_SUBSYS", "INIT,NET")
    env["NCCL_DEBUG_FILE"] = str(path)
    return path


@contextmanager
def nccl_log_for_one_run(env=os.environ) -> Iterator[Path | None]:
    """capture_nccl_log while one run lasts into a private file with no name (NCCL opens
    its log by path: it gets this process's descriptor, /proc/PID/fd/N), then its
    variables removed; None where the user chose NCCL's log (NCCL_DEBUG or
    NCCL_DEBUG_FILE set). Not the group-writable run folder, where a neighbour could
    plant the name; and nothing is left in the node's /tmp by a rank that ends without
    unwinding (SLURM's SIGKILL after a preemption, os._exit), as a private folder was."""
    with tempfile.TemporaryFile(prefix="hpc-train-nccl-") as log:
        before = {name: env.get(name) for name in NCCL_LOG_VARIABLES}
        path = capture_nccl_log(fd_path(log.fileno()), env)
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


def fallback_fabric(nccl: dict, devices: dict[str, list[str]], num_nodes: int) -> str | None:
    """The fabric kind (infiniband, cxi) NCCL left unused for TCP sockets, else None."""
    present = [kind for kind, names in devices.items() if names]
    return present[0] if present and uses_sockets(nccl, num_nodes) else None


def tcp_fallback_warning(backend: str | None, nccl_log: Path | None, num_nodes: int,
                         sys_class: Path = SYS_CLASS) -> str | None:
    """One line for a training's log when NCCL took TCP sockets on a node with a faster
    fabric (as doctor's transport check warns), with the fix; else None."""
    if backend != "nccl":
        return None
    devices = fabric_devices(sys_class)
    kind = fallback_fabric(read_nccl_log(nccl_log), devices, num_nodes)
    if kind is None:
        return None
    return (f"NCCL fell back to TCP sockets on a machine with {FABRICS[kind]} "
            f"({', '.join(devices[kind])}); {FABRIC_FIX[kind]}")
