"""A background writer that does not answer (workload.checkpoint.background): how it is
named while the loop waits, whether it is stuck, and whether a preemption came meanwhile.
Torch-free.

The loop waits for the writer in slices of a second, so that it can say what the writer
is doing (its state, from /proc/PID/stat: stopped by SIGSTOP or a debugger, waiting for a
disk, sleeping) and act on a preemption signal, which only sets a flag
(workload.launch.preemption) and is otherwise never looked at while the loop waits. A
stopped writer, or one that used no CPU time for HUNG_S seconds after the signal (a hung
file system), will not commit the save within a grace time: the loop leaves without it.

While it waits, the writer is this process's `waited_writer()`: train's stall watchdog
(workload.training.watchdog) names it in its stall line, with what to do, rather than
advise waiting for a collective timeout that a wait for one process never reaches.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager

from workload.files import proc_stat_fields

# The first line about a writer that has not answered, then at twice the time each.
STALL_SAY_S = 10.0
# After a preemption signal: a writer that used no CPU time for this long is hung.
HUNG_S = 10.0
STATES = {"R": "running", "S": "sleeping", "D": "waiting for a disk (uninterruptible)",
          "T": "stopped", "t": "stopped by a debugger", "Z": "ended, not yet reaped"}
# The signals a PreemptionFlag may hold (workload.launch.preemption's choices).
PREEMPTION_SIGNALS = (signal.SIGTERM, signal.SIGUSR2, signal.SIGUSR1, signal.SIGINT,
                      signal.SIGHUP)


class StallWatch:
    """The writer process `pid`, as the loop waits for it to commit `step`."""

    def __init__(self, pid: int, step: int):
        self.pid = pid
        self.step = step
        self.cpu: int | None = None  # its CPU time (clock ticks) when last seen to change
        self.since = self.started = time.monotonic()

    def _stat(self) -> tuple[str, int] | None:
        """Its state letter and CPU time (user + system clock ticks); None when gone."""
        fields = proc_stat_fields(self.pid)
        return None if fields is None else (fields[0], int(fields[11]) + int(fields[12]))

    def named(self) -> str:
        stat = self._stat()
        if stat is None:
            return f"PID {self.pid}, gone"
        return f"PID {self.pid}, state {stat[0]}: {STATES.get(stat[0], 'unknown')}"

    def waiting(self) -> str:
        """What the loop waits for, how long, and what to do, in words."""
        waited = time.monotonic() - self.started
        return (f"the checkpoint writer ({self.named()}) to commit step {self.step}, for "
                f"{waited:.0f} s; a stopped one goes on after kill -CONT {self.pid}, and a "
                "preemption signal leaves without this save while it is stopped or hung")

    def stuck(self) -> bool:
        """Stopped, or no CPU time used for HUNG_S seconds since it was first asked."""
        stat = self._stat()
        if stat is None:
            return False  # gone: its answer (the end of its output) is there to read
        state, cpu = stat
        now = time.monotonic()
        if cpu != self.cpu:
            self.cpu = cpu
            self.since = now
        return state in "Tt" or now - self.since >= HUNG_S


_waited: list[StallWatch] = []  # the writer this process waits for now, if any


@contextmanager
def waiting_for(watch: StallWatch) -> Iterator[StallWatch]:
    """`watch` is waited_writer() while the loop waits for it."""
    _waited.append(watch)
    try:
        yield watch
    finally:
        _waited.remove(watch)


def waited_writer() -> StallWatch | None:
    """The checkpoint writer this process waits for now (read by the stall watchdog's
    thread), None while it waits for none."""
    return next(iter(_waited), None)


def preemption_signal() -> str | None:
    """The signal a PreemptionFlag of this process recorded, None when none did. The flag
    is found through the handler it installed (its bound method), so that any loop's
    flag counts, train's and a user's alike."""
    for number in PREEMPTION_SIGNALS:
        name = getattr(getattr(signal.getsignal(number), "__self__", None), "signal_name",
                       None)
        if isinstance(name, str):
            return name
    return None
