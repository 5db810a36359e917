"""A background writer that does not answer (workload.checkpoint.background): how it is
named while the loop waits, whether it is stuck, and whether a preemption came meanwhile.
Torch-free.

The loop waits for the writer in slices of a second, so that it can say what the writer
is doing (its state, from /proc/PID/stat: stopped by SIGSTOP or a debugger, waiting for a
disk, sleeping) and act on a preemption signal, which only sets a flag
(workload.launch.preemption) and is otherwise never looked at while the loop waits. After
the signal, a stopped writer will not commit the save within a grace time: the loop
leaves without it at once. A writer with a thread waiting for its disk (state D: in an
fsync or a write on a file system that stalls) is nearly done: it is waited for up to
DISK_WAIT_S after the signal, then left. One in neither state that used no CPU time for
HUNG_S seconds (waiting on a lock, say), counted from when it last waited for its disk,
is left then. The line at the signal says which.

While it waits, the writer's StallWatch is the one checkpoint object's
`Session.waited_writer()` (workload.checkpoint.session), which train passes to its stall
watchdog (workload.training.watchdog): the stall line names it, with what to do, rather
than advise waiting for a collective timeout that a wait for one process never reaches.
The preemption flag the wait acts on is passed the same way: the loop's own.
"""

from __future__ import annotations

import os
import time

from workload.files import proc_stat_fields
from workload.logs import logger

# The first line about a writer that has not answered, then at twice the time each.
STALL_SAY_S = 10.0
# After a preemption signal: a writer that used no CPU time for this long is hung.
HUNG_S = 10.0
# After a preemption signal: how long a writer waiting for its disk is waited for. SLURM
# kills the step GraceTime seconds after its SIGTERM (a partition's setting: 10 s on the
# test cluster) and the job scripts' time-limit signal comes 300 s before the limit
# (jobs/lib/requeue.sh): a wait past the grace time gains nothing, as the kill ends it,
# and one within it may keep the save; so the wait fits well inside the 300 s, leaving
# the exit and the requeue their time.
DISK_WAIT_S = 60.0
STATES = {"R": "running", "S": "sleeping", "D": "waiting for a disk (uninterruptible)",
          "T": "stopped", "t": "stopped by a debugger", "Z": "ended, not yet reaped"}


class StallWatch:
    """The writer process `pid`, as the loop waits for it to commit `step`."""

    def __init__(self, pid: int, step: int):
        self.pid = pid
        self.step = step
        self.cpu: int | None = None  # its CPU time (clock ticks) when last seen to change
        self.since = self.started = time.monotonic()
        self.signalled: float | None = None  # when stuck() was first asked

    def _stat(self) -> tuple[str, int] | None:
        """Its state letter and CPU time (user + system clock ticks, all its threads);
        None when gone. The state is the main thread's, except D when another thread
        waits for the disk: the main one waits for it on a lock then (writer.py fsyncs
        from a thread of its pool), and /proc/PID/stat shows the main thread only."""
        fields = proc_stat_fields(self.pid)
        if fields is None:
            return None
        state = fields[0]
        if state not in "TtZ" and "D" in self._thread_states():
            state = "D"
        return state, int(fields[11]) + int(fields[12])

    def _thread_states(self) -> set[str]:
        try:
            threads = os.listdir(f"/proc/{self.pid}/task")
        except OSError:
            return set()
        return {fields[0] for fields in
                (proc_stat_fields(f"{self.pid}/task/{tid}") for tid in threads) if fields}

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

    def stuck(self, signal_name: str) -> bool:
        """Asked each second after the preemption signal `signal_name`: stopped; waiting
        for its disk for DISK_WAIT_S seconds since the first asking; or, in neither state,
        no CPU time used for HUNG_S seconds since it was last seen waiting for its disk.
        The first asking says how long it waits (a stopped one is left at once: the loop's
        line says so)."""
        stat = self._stat()
        if stat is None:
            return False  # gone: its answer (the end of its output) is there to read
        state, cpu = stat
        if state in "Tt":
            return True
        now = time.monotonic()
        if self.signalled is None:
            self.signalled = now
            logger.warning(f"{signal_name} while the checkpoint writer ({self.named()}) "
                           f"holds the save of step {self.step}: {self.plan(state)}")
        if cpu != self.cpu or state == "D":
            # Time in D is the disk's, not a hang's: a writer the disk has just let go
            # may use no CPU time in its first clock tick, and is not hung for that.
            self.cpu = cpu
            self.since = now
        if state == "D":
            return now - self.signalled >= DISK_WAIT_S
        return now - self.since >= HUNG_S

    @staticmethod
    def plan(state: str) -> str:
        if state == "D":
            return (f"waiting up to {DISK_WAIT_S:.0f} s for it to commit (it waits for its "
                    "disk), then leaving without it")
        return (f"waiting for it to commit, and leaving without it once it has used no CPU "
                f"time for {HUNG_S:.0f} s")
