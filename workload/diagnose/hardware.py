"""A rank's error that a broken GPU or fabric gives, read from the last heartbeat its stall
watchdog wrote as the rank failed, or from its start-up record when it failed before its
first step (`error`: the exception's type and message), and the nodes such ranks ran on:
diagnose's decision leaves them behind (docs/failures.md).

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


def rank_errors(ranks: dict[str, dict], since: float) -> dict[str, tuple[str, str]]:
    """rank -> (its node, its error or ""), from diagnose's `ranks` (rank -> record):
    the error of the last heartbeat (a failure in training) or of the start-up record (a
    failure before the first step), each only when written after `since` (the last
    decision): an earlier attempt's error must not name its node again."""
    found = {}
    for rank, r in ranks.items():
        if r.get("error") and r.get("time", 0) > since:
            found[rank] = (r.get("host", ""), r["error"])
        elif r.get("startup_error") and r.get("startup_at", 0) > since:
            found[rank] = (r.get("startup_host", ""), r["startup_error"])
        else:
            found[rank] = (r.get("host", ""), "")
    return found


def hardware_nodes(errors: dict[str, tuple[str, str]]) -> dict[str, str]:
    """node -> why, for the ranks of this attempt (rank_errors) that failed with the
    hardware's error. A GPU error names its rank's node. An NCCL system error names its
    node only when some rank did not have one: when every rank has, a peer or the fabric
    between them failed, and no node can be told apart."""
    kinds = {rank: hardware_kind(error) for rank, (_, error) in errors.items()}
    every_rank_fabric = all(kind == FABRIC for kind in kinds.values())
    named: dict[str, str] = {}
    for rank, kind in sorted(kinds.items(), key=lambda item: int(item[0])):
        host, error = errors[rank]
        if (not kind or (kind == FABRIC and every_rank_fabric) or not is_node_name(host)
                or host in named):
            continue
        named[host] = f"rank {rank} failed with {kind}: {error}"
    return named
