"""Freeze processes the way a hung node holds them: every thread of each PID and of its
descendants is held in a ptrace stop, which no signal but SIGKILL ends. A SIGSTOP freeze
does not hold: SLURM sends SIGCONT with the SIGTERM that ends a step, and the thawed
ranks then run their watchdogs and write dumps a hung node never writes. Prints
"frozen N" once all N threads are stopped, then reaps its tracees (so their parents see
them exit) and ends when none is left.

    PYTHONPATH=REPO python tests/scripts/ptrace_freeze.py PID...
"""

from __future__ import annotations

import ctypes
import errno
import os
import sys

from tests.helpers.hangs import descendants

PTRACE_SEIZE, PTRACE_INTERRUPT = 0x4206, 0x4207
# PTRACE_O_TRACEFORK | _TRACEVFORK | _TRACECLONE: a thread or process started while the
# others are being stopped is traced and stopped from its start.
FOLLOW_NEW = 0x2 | 0x4 | 0x8
WALL = 0x40000000  # __WALL: wait for threads as well as processes

libc = ctypes.CDLL(None, use_errno=True)
libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]


def ptrace(request: int, tid: int, data: int = 0) -> None:
    if libc.ptrace(request, tid, None, data) == -1:
        code = ctypes.get_errno()
        raise OSError(code, f"ptrace {request:#x} on {tid}: {os.strerror(code)}")


def threads(pids: list[int]) -> set[int]:
    """Every thread of each PID and of its descendants, as they are now."""
    found = set()
    for process in descendants(*pids):
        try:
            found.update(int(task) for task in os.listdir(f"/proc/{process}/task"))
        except FileNotFoundError:  # it ended meanwhile
            pass
    return found


def tracer_of(tid: int) -> int | None:
    try:
        with open(f"/proc/{tid}/status") as status:
            return next(int(line.split()[1]) for line in status if line.startswith("TracerPid:"))
    except (OSError, StopIteration):
        return None


def stop(tid: int) -> None:
    """Attach to TID and wait until it is stopped; nothing when it has ended, or when this
    process traces it already (a thread started traced by FOLLOW_NEW: stopped from its
    start). Another refusal (Yama's ptrace_scope, another tracer) ends the script."""
    try:
        ptrace(PTRACE_SEIZE, tid, FOLLOW_NEW)
        ptrace(PTRACE_INTERRUPT, tid)
        os.waitpid(tid, WALL)
    except (ChildProcessError, ProcessLookupError):
        pass
    except OSError as error:
        if error.errno != errno.EPERM or tracer_of(tid) != os.getpid():
            raise


def main(pids: list[int]) -> None:
    held: set[int] = set()
    # Until a pass finds no thread it has not stopped: a stopped thread starts none.
    while new := threads(pids) - held:
        for tid in sorted(new):
            stop(tid)
        held |= new
    print(f"frozen {len(held)}", flush=True)
    while True:
        try:
            os.waitpid(-1, WALL)
        except ChildProcessError:
            return


if __name__ == "__main__":
    main([int(pid) for pid in sys.argv[1:]])
