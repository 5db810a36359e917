"""Every rank's call of `Checkpoints.save` met first through the process group's store,
before any collective of the save: a loop that saves on rank 0 only (`if rank == 0:`, the
habit of `torch.save` loops) left rank 0 in the save's first collective and the others in
their next step's, both silent until the process group's timeout. Here rank 0 waits for
every rank's mark of the same save, not in a collective, and says within seconds that
save is a collective; past the process group's timeout it raises that line.

Each rank sets one key per save (its own, the one before deleted), rank 0 asks for every
rank's in one round trip per look: a handful of store operations per save, none per step.
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
    """The save marks of one Checkpoints object of a group of `world_size` ranks."""

    def __init__(self, folder, rank: int, world_size: int):
        self.rank = rank
        self.world_size = world_size
        name = hashlib.sha256(str(folder).encode()).hexdigest()[:12]
        self.prefix = f"{PREFIX}/{name}-{next(_OPENED)}"
        self.count = 0

    def key(self, index: int, rank: int) -> str:
        return f"{self.prefix}/save-{index}/rank-{rank}"

    def meet(self, step: int) -> None:
        """Mark this rank's save and wait, not in a collective, for the others': rank 0
        for every rank's (and says which have not come), the others for rank 0's."""
        store = _store() if self.world_size > 1 else None
        if store is None:
            return
        self.count += 1
        store.set(self.key(self.count, self.rank), str(step))
        if self.count > 1:
            store.delete_key(self.key(self.count - 1, self.rank))
        others = [r for r in (range(self.world_size) if self.rank == 0 else [0])
                  if r != self.rank]
        self._wait(store, others, step)

    def _wait(self, store, others: list[int], step: int) -> None:
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
                line = _line(self.rank, missing, step, waited)
                if waited >= limit:
                    raise UsageError(line + f"; gave up after the process group's timeout "
                                            f"({limit:.0f} s)")
                logger.warning(line)
                say_at *= 2
            time.sleep(pause)
            pause = min(pause * 2, LOOK_S[1])


def _line(rank: int, missing: list[int], step: int, waited: float) -> str:
    ranks = ", ".join(map(str, missing[:8])) + (", ..." if len(missing) > 8 else "")
    who = f"rank{'s' if len(missing) > 1 else ''} {ranks}"
    return (f"Checkpoints.save: save is a collective: call it on every rank (not under "
            f"`if rank == 0:`); rank {rank} has waited {waited:.0f} s in the save of step "
            f"{step} for {who} to call it too")


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
