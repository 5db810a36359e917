"""jobs/lib/requeue.sh on its own: the batch shell's signal reaches the step, status 75
requeues through `scontrol` up to MAX_REQUEUES, any other status passes through.

`scontrol` is a stub that records its arguments (a unit test of the script's decisions);
tests/e2e/test_preemption_slurm.py runs the same script under the real SLURM cluster.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO

REQUEUE_SH = REPO / "jobs" / "lib" / "requeue.sh"

# The step: waits for USR2 (or TERM), then exits with the status it was given; "killed"
# writes the requeue file as a preempted rank does, then exits as srun reports a rank
# killed by --kill-on-bad-exit (143).
STEP = """
import os, signal, sys, time

got = []
for name in ("SIGUSR2", "SIGTERM"):
    signal.signal(getattr(signal, name), lambda n, f: got.append(signal.Signals(n).name))
print("step ready", flush=True)
deadline = time.time() + 60
while not got and time.time() < deadline:
    time.sleep(0.01)
print("step got", got, flush=True)
if sys.argv[1] == "killed":
    open(os.environ["TRAIN_REQUEUE_FILE"], "w").write("preempted by SIGUSR2 at step 7")
    sys.exit(143)
sys.exit(int(sys.argv[1]))
"""


def batch_shell(tmp_path: Path, status: int | str, restart_count: int | None) -> subprocess.Popen:
    stubs = tmp_path / "bin"
    stubs.mkdir()
    (stubs / "scontrol").write_text(f'#!/bin/sh\necho "$@" >> {tmp_path}/scontrol.calls\n')
    (stubs / "scontrol").chmod(0o755)
    (tmp_path / "step.py").write_text(STEP)
    env = {"PATH": f"{stubs}:/usr/bin:/bin", "SLURM_JOB_ID": "4242", "MAX_REQUEUES": "2",
           "TRAIN_REQUEUE_FILE": str(tmp_path / "requeue-request")}
    if restart_count is not None:
        env["SLURM_RESTART_COUNT"] = str(restart_count)
    script = (f'set -Eeuo pipefail; source "{REQUEUE_SH}"; '
              f'run_requeueable "{sys.executable}" "{tmp_path}/step.py" {status}')
    return subprocess.Popen(["bash", "-c", script], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def signal_batch_shell(proc: subprocess.Popen, signum=signal.SIGUSR2) -> tuple[str, str]:
    assert proc.stdout.readline().strip() == "step ready"
    proc.send_signal(signum)  # what --signal=B:USR2@<seconds> does: the batch shell only
    out, err = proc.communicate(timeout=60)
    return out, err


def calls(tmp_path: Path) -> list[str]:
    path = tmp_path / "scontrol.calls"
    return path.read_text().splitlines() if path.exists() else []


@pytest.mark.parametrize("restart_count", [None, 1])
def test_preempted_step_is_requeued_on_the_host(tmp_path, restart_count):
    proc = batch_shell(tmp_path, 75, restart_count)
    out, err = signal_batch_shell(proc)
    assert "step got ['SIGUSR2']" in out
    assert calls(tmp_path) == ["requeue 4242"]
    assert proc.returncode == 0
    assert f"({(restart_count or 0) + 1} of 2)" in err


def test_requeues_stop_at_the_cap(tmp_path):
    proc = batch_shell(tmp_path, 75, restart_count=2)
    out, err = signal_batch_shell(proc)
    assert calls(tmp_path) == [] and proc.returncode == 75
    assert "MAX_REQUEUES=2" in err and "not requeued" in err


def test_sigterm_is_passed_on_too(tmp_path):
    proc = batch_shell(tmp_path, 75, 0)
    out, _ = signal_batch_shell(proc, signal.SIGTERM)
    assert "step got ['SIGTERM']" in out and calls(tmp_path) == ["requeue 4242"]


@pytest.mark.parametrize("status", [0, 1, 2])
def test_other_statuses_pass_through_without_requeue(tmp_path, status):
    proc = batch_shell(tmp_path, status, 0)
    _, err = signal_batch_shell(proc)
    assert proc.returncode == status, err
    assert calls(tmp_path) == []


def test_the_requeue_file_counts_when_srun_reports_another_status(tmp_path):
    proc = batch_shell(tmp_path, "killed", 0)
    _, err = signal_batch_shell(proc)
    assert calls(tmp_path) == ["requeue 4242"] and proc.returncode == 0
    assert "status 143: preempted by SIGUSR2 at step 7" in err
    assert not (tmp_path / "requeue-request").exists()
