"""Running one part of the GPU check so that nothing it started outlives it.

Each part runs in a process group of its own. At its limit the part's first process gets
SIGINT (pytest then writes junit.xml with every result so far, and Python code unwinds),
then whatever is left gets SIGTERM, then SIGKILL. After every part, stopped or not, the
processes it left behind are swept the same way: its process group, and every process
that started during the part under this one (torchrun gives each worker a session of its
own, outside the group; a worker whose torchrun died is re-parented here because
`adopt_orphans` makes this process their subreaper). On a GPU a leftover would hold the
GPU through the next part. Standard library only, Linux's /proc where it exists.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

INTERRUPT_GRACE_S = 20  # pytest's KeyboardInterrupt ends the session and writes junit.xml
TERM_GRACE_S = 5
STOP_RESERVE_S = INTERRUPT_GRACE_S + 2 * TERM_GRACE_S  # what a stop may add to a limit
PR_SET_CHILD_SUBREAPER = 36


@dataclass(frozen=True)
class Finished:
    exit_status: int
    seconds: float
    limit_s: float
    stopped: bool  # ran into its limit and was stopped


def adopt_orphans() -> None:
    """Become the subreaper of every process started from here (Linux): one whose parent
    dies is re-parented to this process, not to init, so the sweep still finds it. Only
    for the kit's own process: a test session would collect other tests' orphans."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass  # not Linux: the process group is the sweep


def run_logged(command: list[str], log: Path, env: dict, limit: float, cwd: Path) -> Finished:
    """Run `command` in a process group of its own, its output into `log`; stop it at
    `limit` seconds; sweep what it left."""
    print("gpu-check: $ " + " ".join(command), flush=True)
    started, before = time.monotonic(), descendants(os.getpid())
    with open(log, "w") as out:
        process = subprocess.Popen(command, cwd=cwd, env=env, stdout=out,
                                   stderr=subprocess.STDOUT, start_new_session=True,
                                   preexec_fn=interruptible)
        try:
            status, stopped = process.wait(timeout=limit), False
        except subprocess.TimeoutExpired:
            status, stopped = stop(process), True
        finally:
            sweep(process.pid, before)
        if stopped:
            out.write(f"\ngpu-check: stopped after {limit:.0f} s\n")
    return Finished(status, time.monotonic() - started, limit, stopped)


def interruptible() -> None:
    """In the part's process before it starts: SIGINT back to its default. A check started
    in the background (`make gpu-check &`, a batch script's `&`) passes SIGINT on ignored,
    and a part that ignores it would never write its results when `stop` interrupts it."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def stop(process: subprocess.Popen) -> int:
    """SIGINT to the part's first process, then SIGTERM and SIGKILL to its group."""
    for signum, group, grace in ((signal.SIGINT, False, INTERRUPT_GRACE_S),
                                 (signal.SIGTERM, True, TERM_GRACE_S),
                                 (signal.SIGKILL, True, None)):
        try:
            (os.killpg if group else os.kill)(process.pid, signum)
        except ProcessLookupError:
            pass
        try:
            return process.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            continue
    return process.wait()


def sweep(group: int, before: set[int]) -> None:
    """SIGTERM, then SIGKILL, to what a part left: its group and the processes under this
    one that were not there before it."""
    for signum, grace in ((signal.SIGTERM, TERM_GRACE_S), (signal.SIGKILL, TERM_GRACE_S)):
        left = leftovers(group, before)
        if not left:
            return
        for pid in left:
            _signal(pid, signum)
        _wait_gone(left, grace)


def leftovers(group: int, before: set[int]) -> set[int]:
    found = descendants(os.getpid()) - before
    found |= {pid for pid, (_, _, pgrp) in _table().items() if pgrp == group}
    return {pid for pid in found if _alive(pid)}


def descendants(root: int) -> set[int]:
    """Every live process under `root`, from /proc (empty where there is none)."""
    children: dict[int, list[int]] = {}
    for pid, (_, ppid, _) in _table().items():
        children.setdefault(ppid, []).append(pid)
    found, todo = set(), [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def _table() -> dict[int, tuple[str, int, int]]:
    """pid -> (state, parent pid, process group) of every process, from /proc."""
    table = {}
    for entry in Path("/proc").glob("[0-9]*"):
        if (found := _stat(int(entry.name))) is not None:
            table[int(entry.name)] = found
    return table


def _stat(pid: int) -> tuple[str, int, int] | None:
    """(state, parent pid, process group) of one process; None once it has gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields[0], int(fields[1]), int(fields[2])


def _alive(pid: int) -> bool:
    """Running, not a zombie (one of ours is reaped here)."""
    try:
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return False
    except ChildProcessError:
        pass  # not our child: its own parent reaps it
    if Path("/proc").is_dir():
        found = _stat(pid)
        return found is not None and found[0] != "Z"
    return _signal(pid, 0)


def _signal(pid: int, signum: int) -> bool:
    try:
        os.kill(pid, signum)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def _wait_gone(pids: set[int], grace: float) -> None:
    deadline = time.monotonic() + grace
    while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
