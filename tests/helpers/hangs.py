"""A command that hangs says where: each process and thread of its tree, its state, the
kernel's wait channel and stack (a thread stopped by a tracer reads `ptrace_stop`, one
waiting on a lock `futex_wait...`) and a Python process's own stacks (py-spy, reading
its memory without attaching: a process under strace has its tracer already), taken
before the tree is killed. And a hang made on purpose: a tree frozen as a hung node
freezes it (`frozen`)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.helpers import REPO
from workload.files import proc_stat_fields

PROC = Path("/proc")
PY_SPY = Path(sys.executable).parent / "py-spy"


def read(path: Path) -> str:
    try:
        return path.read_text(errors="replace").strip()
    except OSError as error:  # the task ended, or its stack is root's to read
        return f"({error.strerror})"


def children() -> dict[int, list[int]]:
    """Each live process's children, from /proc/PID/stat's parent field."""
    tree: dict[int, list[int]] = {}
    for entry in PROC.iterdir():
        if entry.name.isdigit() and (fields := proc_stat_fields(entry.name)):
            tree.setdefault(int(fields[1]), []).append(int(entry.name))
    return tree


def descendants(*pids: int) -> list[int]:
    """PIDS and every process below them, each once, from one look at /proc."""
    tree, found = children(), list(dict.fromkeys(pids))
    for parent in found:
        found += [child for child in tree.get(parent, []) if child not in found]
    return found


def thread_states(pid: int) -> str:
    """One block a process: its command line, then a line a thread (name, state, wait
    channel) with its kernel stack."""
    command = read(PROC / str(pid) / "cmdline").replace("\0", " ")[:300]
    lines = [f"pid {pid}: {command}"]
    for task in sorted((PROC / str(pid) / "task").glob("*"), key=lambda t: int(t.name)):
        state = (proc_stat_fields(f"{pid}/task/{task.name}") or ["gone"])[0]
        lines.append(f"  thread {task.name} ({read(task / 'comm')}) state {state} "
                     f"wchan {read(task / 'wchan')}")
        lines += [f"    {frame}" for frame in read(task / "stack").splitlines()]
    if "python" in command.split(" ")[0]:
        lines.append(python_stacks(pid))
    return "\n".join(lines)


def python_stacks(pid: int) -> str:
    try:
        dump = subprocess.run([str(PY_SPY), "dump", "--nonblocking", "--pid", str(pid)],
                              capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"  (py-spy: {error})"
    return "\n".join(f"  | {line}" for line in (dump.stdout + dump.stderr).splitlines())


def run_or_explain(argv: list[str], timeout: float, **kwargs) -> subprocess.CompletedProcess:
    """subprocess.run(argv, capture_output=True, text=True, timeout=timeout) in a session
    of its own; when the time is up, the failure has every process of the tree as it
    was (thread_states) and what the command printed, and the whole tree is killed."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, **kwargs)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        where = "\n".join(thread_states(pid) for pid in descendants(proc.pid))
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise AssertionError(f"{argv[0]} did not end in {timeout:.0f} s; its processes "
                             f"then:\n{where}\n--- stdout\n{out[-3000:]}\n--- stderr\n"
                             f"{err[-3000:]}") from None
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


@contextlib.contextmanager
def frozen(pids: list[int]):
    """PIDS and their descendants held as a hung node holds them, for good: in a ptrace stop
    (tests/scripts/ptrace_freeze.py), which SIGCONT and SIGTERM do not end and SIGKILL
    does. Yields the tracer and how many threads it stopped; the tracer goes at the end."""
    tracer = subprocess.Popen(
        [sys.executable, str(REPO / "tests" / "scripts" / "ptrace_freeze.py"), *map(str, pids)],
        env=dict(os.environ, PYTHONPATH=str(REPO)), stdout=subprocess.PIPE, text=True)
    try:
        said = tracer.stdout.readline().split()
        assert said[:1] == ["frozen"], f"ptrace_freeze.py said {said}, status {tracer.wait()}"
        yield tracer, int(said[1])
    finally:
        tracer.kill()
        tracer.wait()
