"""A command that outlives its time fails saying where each of its processes was."""

from __future__ import annotations

import sys

import pytest

from tests.helpers.hangs import run_or_explain

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
