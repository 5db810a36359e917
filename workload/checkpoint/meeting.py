"""Every rank's call of a collective of `Checkpoints` (resume, save, wait, close) met
first through the process group's store, before any collective of the call: a loop that
saves on rank 0 only (`if rank == 0:`, the habit of `torch.save` loops) left rank 0 in the
save's first collective and the others in their next step's, both silent until the
process group's timeout. Here each rank marks its n-th call with the call's name; rank 0
waits for every rank's n-th mark, the others for rank 0's, not in a collective. Marks of
other calls (rank 0's save where rank 1 waits) are refused at once in one line; marks that
do not come are named by rank 0 within seconds (`SAY_AFTER_S`), and at the process
group's timeout the line is raised.

Each rank sets one key per call (its own, the one before deleted) and rank 0 asks for
every rank's in one round trip per look: a handful of store operations per call, none per
step (`preempted` is not met: it runs every step, and its all-reduce is the loop's own).
Torch is imported by the calls only.
"""

from __future__ import annotations

import hashlib
import itertools
import time
from datetime import timedelta

from workload.errors import UsageError
from workload.logs import logger

PREFIX = "workload/checkpoints"
SAY_AFTER_S = 10.0   # the first line about ranks that did not come, then at doubling times
LOOK_S = (0.01, 1.0)  # the first pause between looks, growing to the second
_OPENED = itertools.count()  # Checkpoints objects made in this process, the same on every rank


class Meeting:
    """The marks of one Checkpoints object of a group of `world_size` ranks; `store`:
    the process group's (default), or one given."""

    def __init__(self, folder, rank: int, world_size: int, store=None):
        self.rank = rank
        self.world_size = world_size
        name = hashlib.sha256(str(folder).encode()).hexdigest()[:12]
        self.prefix = f"{PREFIX}/{name}-{next(_OPENED)}"
        self.count = 0
        self.store = store

    def key(self, index: int, rank: int) -> str:
        return f"{self.prefix}/call-{index}/rank-{rank}"

    def meet(self, call: str, what: str = "") -> None:
        """Mark this rank's call (`call`: its name; `what`: the words after it, e.g.
        "of step 8") and wait for the others' marks of the same call."""
        store = self.store or (_store() if self.world_size > 1 else None)
        if store is None:
            return
        self.count += 1
        store.set(self.key(self.count, self.rank), call)
        if self.count > 1:
            store.delete_key(self.key(self.count - 1, self.rank))
        others = [r for r in (range(self.world_size) if self.rank == 0 else [0])
                  if r != self.rank]
        self._wait(store, others, call, what)
        for rank in others:
            theirs = store.get(self.key(self.count, rank)).decode()
            if theirs != call:
                raise UsageError(f"Checkpoints.{call}: rank {rank} called {theirs}() where "
                                 f"rank {self.rank} called {call}(): {call} is a collective: "
                                 "call it on every rank, in the same order (not under `if "
                                 "rank == 0:`)")

    def _wait(self, store, others: list[int], call: str, what: str) -> None:
        keys = [self.key(self.count, rank) for rank in others]
        started = time.monotonic()
        say_at = SAY_AFTER_S
        pause = LOOK_S[0]
        limit = _seconds(store.timeout)
        while not store.check(keys):
            waited = time.monotonic() - started
            # Rank 0 says it; the others wait for rank 0, as in a collective, silently.
            if waited >= limit or (self.rank == 0 and waited >= say_at):
                missing = [rank for rank, key in zip(others, keys) if not store.check([key])]
                line = _line(self.rank, missing, call, what, waited)
                if waited >= limit:
                    raise UsageError(line + f"; gave up after the process group's timeout "
                                            f"({limit:.0f} s)")
                logger.warning(line)
                say_at *= 2
            time.sleep(pause)
            pause = min(pause * 2, LOOK_S[1])


def _line(rank: int, missing: list[int], call: str, what: str, waited: float) -> str:
    ranks = ", ".join(map(str, missing[:8])) + (", ..." if len(missing) > 8 else "")
    who = f"rank{'s' if len(missing) > 1 else ''} {ranks}"
    return (f"Checkpoints.{call}: {call} is a collective: call it on every rank (not under "
            f"`if rank == 0:`); rank {rank} has waited {waited:.0f} s in the {call}"
            f"{' ' + what if what else ''} for {who} to call it too")


def _store():
    """The default process group's store, or None (no group, or a torch without it)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return None
    try:
        from torch.distributed.distributed_c10d import _get_default_store
        return _get_default_store()
    except (ImportError, RuntimeError, ValueError):
        return None


def _seconds(timeout) -> float:
    return timeout.total_seconds() if isinstance(timeout, timedelta) else float(timeout)
