"""A rank's error that a broken GPU or fabric gives, read from the last heartbeat its stall
watchdog wrote as the rank failed (`error`: the exception's type and message), and the
nodes such ranks ran on: diagnose's decision leaves them behind (docs/failures.md).

Only errors that name the hardware count, not every CUDA error: "out of memory", a
device-side assert or an illegal memory access come from the program, fail the same way
on any node, and leaving a node behind for them would only shrink the allocation (the
count of attempts without progress stops such a run instead)."""

from __future__ import annotations

import re

from workload.diagnose.attempts import is_node_name

# The GPU itself: CUDA's and the driver's words for a device that failed under the rank.
_GPU = re.compile(r"unspecified launch failure|fallen off the bus|\bXid\b|uncorrectable ECC"
                  r"|ECC error|GPU is lost|CUDA error: unknown error|CUDA_ERROR_ECC"
                  r"|CUDA_ERROR_LAUNCH_FAILED|NCCL[^\n]*unhandled cuda error", re.IGNORECASE)
# Any other "CUDA error: ..." is the GPU's too, except these, which are the program's.
_CUDA = re.compile(r"CUDA error", re.IGNORECASE)
_PROGRAM = re.compile(r"out of memory|device-side assert|illegal memory access|invalid "
                      r"argument|invalid configuration|no kernel image|invalid device "
                      r"function|operation not permitted|misaligned address", re.IGNORECASE)
# The fabric under NCCL: a rank's own NIC or link, or a peer that died before it.
_FABRIC = re.compile(r"NCCL[^\n]*unhandled system error", re.IGNORECASE)

GPU = "a GPU error"
FABRIC = "an NCCL system error"


def hardware_kind(error: str) -> str:
    """GPU, FABRIC or "" (not the hardware's, as far as the message says)."""
    if _GPU.search(error) or (_CUDA.search(error) and not _PROGRAM.search(error)):
        return GPU
    return FABRIC if _FABRIC.search(error) else ""


def hardware_nodes(ranks: dict[str, dict]) -> dict[str, str]:
    """node -> why, for the ranks of this attempt (diagnose's `ranks`: rank -> record)
    that failed with the hardware's error. A GPU error names its rank's node. An NCCL
    system error names its node only when some rank did not have one: when every rank
    has, a peer or the fabric between them failed, and no node can be told apart."""
    kinds = {rank: hardware_kind(r.get("error", "")) for rank, r in ranks.items()}
    every_rank_fabric = all(kind == FABRIC for kind in kinds.values())
    named: dict[str, str] = {}
    for rank, kind in sorted(kinds.items(), key=lambda item: int(item[0])):
        host = ranks[rank].get("host")
        if (not kind or (kind == FABRIC and every_rank_fabric) or not is_node_name(host)
                or host in named):
            continue
        named[host] = f"rank {rank} failed with {kind}: {ranks[rank]['error']}"
    return named
