"""A command that outlives its time fails saying where each of its processes was; a tree
frozen as a hung node freezes it stays so."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.helpers import wait_for
from tests.helpers.hangs import frozen, run_or_explain

WAITS = "import time\ndef waits_for_nothing():\n    time.sleep(60)\nwaits_for_nothing()\n"


def test_a_hung_tree_is_shown_thread_by_thread_with_python_stacks_then_killed():
    with pytest.raises(AssertionError) as failure:
        run_or_explain(["bash", "-c", f"{sys.executable} -c '{WAITS}' & wait"], timeout=3)
    said = str(failure.value)
    assert said.startswith("bash did not end in 3 s; its processes then:\npid ")
    assert said.count("\npid ") == 2 and "state S wchan do_wait" in said  # bash, then python
    assert "wchan hrtimer_nanosleep" in said
    assert "waits_for_nothing (<string>:3)" in said  # py-spy's frame of the sleeping child


def test_a_command_that_ends_in_time_is_returned_as_run_returns_it():
    done = run_or_explain(["bash", "-c", "echo out; echo err >&2; exit 3"], timeout=30)
    assert (done.returncode, done.stdout, done.stderr) == (3, "out\n", "err\n")


# A process that counts, from two threads and a child process, into one file: a line a
# write(2) each (print's separate writes of the value and the newline would interleave).
COUNTS = """import os, subprocess, sys, threading, time
def count(mark):
    while True:
        os.write(1, mark)
        time.sleep(0.02)
CHILD = "import os, time\\nwhile 1: os.write(1, b'1\\\\n'); time.sleep(0.02)"
subprocess.Popen([sys.executable, "-c", CHILD])
threading.Thread(target=count, args=(b"2\\n",), daemon=True).start()
count(b"3\\n")
"""


@pytest.mark.root  # ptrace of a sibling: Yama's ptrace_scope 1 (Ubuntu's) allows it to root
def test_a_frozen_tree_stays_frozen_through_slurms_cont_and_term_until_killed(tmp_path):
    """tests/scripts/ptrace_freeze.py, as the SLURM hang tests use it."""
    counts = tmp_path / "counts"
    with open(counts, "w") as out:
        counting = subprocess.Popen([sys.executable, "-c", COUNTS], stdout=out,
                                    start_new_session=True)
    try:
        wait_for(lambda: set(counts.read_text().split()) == {"1", "2", "3"},
                 "all three to count", counts, timeout=30, poll=0.05)
        with frozen([counting.pid]) as (tracer, threads):
            assert threads == 3  # two threads, one child
            before = counts.stat().st_size
            for sent in (signal.SIGCONT, signal.SIGTERM):
                os.killpg(counting.pid, sent)
            time.sleep(0.5)
            assert counts.stat().st_size == before and counting.poll() is None
            os.killpg(counting.pid, signal.SIGKILL)
            assert counting.wait(timeout=10) == -signal.SIGKILL
            assert tracer.wait(timeout=10) == 0  # it ends once its tracees have
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(counting.pid, signal.SIGKILL)
