"""end_process: a script's exit status, as `sys.exit(main())` would give it, and after
torch.distributed the end without the interpreter's finalization (workload/launch/ending.py
says why: gloo threads that outlive their group abort a finalizing process).

Each case is a small child Python without torch: torch.distributed is stood in for by
the one fact end_process reads, its name in sys.modules. The real one is exercised by
every distributed `train` and own script of the e2e tests."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

CHILD = """
import atexit, sys, types
from workload.launch import end_process

class Finalized:
    def __del__(self):
        sys.stderr.write("finalized\\n")

keep = Finalized()  # a module global: deleted when the interpreter finalizes
atexit.register(lambda: sys.stderr.write("atexit ran\\n"))
if {joined}:
    sys.modules["torch.distributed"] = types.ModuleType("torch.distributed")
sys.stdout.write("unflushed output")  # no newline: still in the buffer at the end

def body():
{body}

end_process(body)
"""


def run_child(body: str, joined: bool) -> subprocess.CompletedProcess:
    code = CHILD.format(joined=joined, body=textwrap.indent(textwrap.dedent(body), "    "))
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)


STATUSES = [("return None", 0), ("return 0", 0), ("return 75", 75), ("sys.exit(2)", 2),
            ("sys.exit(None)", 0), ("raise SystemExit(75)", 75)]


@pytest.mark.parametrize("joined", [False, True])
@pytest.mark.parametrize("body, status", STATUSES)
def test_the_status_is_the_bodys_and_output_and_atexit_are_kept(body, status, joined):
    done = run_child(body, joined)
    assert done.returncode == status, done.stderr
    assert done.stdout == "unflushed output"
    assert "atexit ran" in done.stderr


@pytest.mark.parametrize("joined", [False, True])
def test_an_exception_is_printed_as_python_prints_it_and_the_status_is_1(joined):
    done = run_child("raise ValueError('bad value')", joined)
    assert done.returncode == 1
    assert "Traceback (most recent call last)" in done.stderr
    assert "ValueError: bad value" in done.stderr


@pytest.mark.parametrize("joined", [False, True])
def test_a_text_exit_is_printed_and_the_status_is_1(joined):
    done = run_child("sys.exit('no data')", joined)
    assert done.returncode == 1 and "no data" in done.stderr


def test_after_torch_distributed_the_interpreter_is_not_finalized():
    assert "finalized" not in run_child("return 0", joined=True).stderr


def test_without_torch_distributed_the_interpreter_ends_as_usual():
    assert "finalized" in run_child("return 0", joined=False).stderr
