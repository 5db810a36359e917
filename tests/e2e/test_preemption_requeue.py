"""jobs/lib/requeue.sh on its own: the batch shell's signal reaches the step, status 75
continues the run (`scontrol requeue`, or with CONTINUE=chain the next job of a chain)
within the cap of its kind (time limit or preemption, counted apart), any other status
passes through.

`scontrol` and `sbatch` are stubs that record their arguments (a unit test of the
script's decisions); tests/e2e/test_preemption_slurm.py runs the same script under the
real SLURM cluster.
"""

from __future__ import annotations

import os
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
print("step ready", os.getpid(), flush=True)
deadline = time.time() + 60
while not got and time.time() < deadline:
    time.sleep(0.01)
print("step got", got, flush=True)
if sys.argv[1] == "killed":
    open(os.environ["TRAIN_REQUEUE_FILE"], "w").write("preempted by SIGUSR2 at step 7")
    sys.exit(143)
sys.exit(int(sys.argv[1]))
"""

# A batch script as users write one: requeue.sh sourced at the top, then the step.
JOB = """set -Eeuo pipefail
source "{requeue_sh}"
run_requeueable "{python}" "{step}" {status}
"""


def batch_shell(tmp_path: Path, status: int | str, before: tuple[str, ...] = (),
                **settings: str) -> subprocess.Popen:
    """The batch shell, with `before` as the continuations already counted for the run."""
    stubs = tmp_path / "bin"
    stubs.mkdir()
    for tool in ("scontrol", "sbatch"):
        (stubs / tool).write_text(f'#!/bin/sh\necho "$@" >> {tmp_path}/{tool}.calls\n'
                                  f'env > {tmp_path}/{tool}.env\necho 4343\n')
        (stubs / tool).chmod(0o755)
    (tmp_path / "step.py").write_text(STEP)
    (tmp_path / "job.sh").write_text(JOB.format(requeue_sh=REQUEUE_SH, python=sys.executable,
                                                step=tmp_path / "step.py", status=status))
    if before:
        (tmp_path / ".train-continuations-4242").write_text("".join(f"{k}\n" for k in before))
    env = {"PATH": f"{stubs}:/usr/bin:/bin", "SLURM_JOB_ID": "4242", "SLURM_CONF": "/x.conf",
           "SLURM_SUBMIT_DIR": str(tmp_path), "MAX_TIME_LIMIT_RESTARTS": "2",
           "TRAIN_REQUEUE_FILE": str(tmp_path / "requeue-request"), **settings}
    return subprocess.Popen(["bash", str(tmp_path / "job.sh"), "--epochs", "5 x"], env=env,
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def signal_batch_shell(proc: subprocess.Popen, signum=signal.SIGUSR2) -> tuple[str, str]:
    assert proc.stdout.readline().startswith("step ready")
    proc.send_signal(signum)  # what --signal=B:USR2@<seconds> does: the batch shell only
    return proc.communicate(timeout=60)


def signal_step(proc: subprocess.Popen) -> tuple[str, str]:
    """What SLURM's preemption does: SIGTERM to the step, the batch shell left alone."""
    os.kill(int(proc.stdout.readline().split()[-1]), signal.SIGTERM)
    return proc.communicate(timeout=60)


def calls(tmp_path: Path, tool: str = "scontrol") -> list[str]:
    path = tmp_path / f"{tool}.calls"
    return path.read_text().splitlines() if path.exists() else []


def counted(tmp_path: Path) -> list[str]:
    return (tmp_path / ".train-continuations-4242").read_text().split()


@pytest.mark.parametrize("before", [(), ("time-limit",)])
def test_preempted_step_is_requeued_on_the_host(tmp_path, before):
    proc = batch_shell(tmp_path, 75, before)
    out, err = signal_batch_shell(proc)
    assert "step got ['SIGUSR2']" in out
    assert calls(tmp_path) == ["requeue 4242"]
    assert proc.returncode == 0
    assert f"time-limit: requeueing job 4242 ({len(before) + 1} of 2)" in err
    assert counted(tmp_path) == [*before, "time-limit"]


def test_requeues_stop_at_the_cap(tmp_path):
    proc = batch_shell(tmp_path, 75, ("time-limit", "time-limit"))
    out, err = signal_batch_shell(proc)
    assert calls(tmp_path) == [] and proc.returncode == 75
    assert "MAX_TIME_LIMIT_RESTARTS=2" in err and "not requeued" in err


def test_preemptions_and_time_limits_have_separate_caps(tmp_path):
    """The time-limit cap is used up, yet a preemption (SIGTERM to the step from SLURM,
    none to this shell) still continues the run, counted as one."""
    proc = batch_shell(tmp_path, 75, ("time-limit", "time-limit"), MAX_PREEMPTIONS="1")
    out, err = signal_step(proc)
    assert "step got ['SIGTERM']" in out and calls(tmp_path) == ["requeue 4242"]
    assert "preemption: requeueing job 4242 (1 of 1)" in err
    assert counted(tmp_path) == ["time-limit", "time-limit", "preemption"]


def test_preemptions_stop_at_their_own_cap(tmp_path):
    proc = batch_shell(tmp_path, 75, ("preemption",), MAX_PREEMPTIONS="1")
    _, err = signal_step(proc)
    assert calls(tmp_path) == [] and proc.returncode == 75
    assert "stopped by preemption after 1" in err and "MAX_PREEMPTIONS=1" in err


def test_sigterm_is_passed_on_too(tmp_path):
    proc = batch_shell(tmp_path, 75)
    out, _ = signal_batch_shell(proc, signal.SIGTERM)
    assert "step got ['SIGTERM']" in out and calls(tmp_path) == ["requeue 4242"]


@pytest.mark.parametrize("status", [0, 1, 2])
def test_other_statuses_pass_through_without_requeue(tmp_path, status):
    proc = batch_shell(tmp_path, status, ("time-limit",))
    _, err = signal_batch_shell(proc)
    assert proc.returncode == status, err
    assert calls(tmp_path) == []
    # A finished run forgets its counts; a failed one keeps them for the resubmission.
    assert (tmp_path / ".train-continuations-4242").exists() == (status != 0)


def test_the_requeue_file_counts_when_srun_reports_another_status(tmp_path):
    proc = batch_shell(tmp_path, "killed")
    _, err = signal_batch_shell(proc)
    assert calls(tmp_path) == ["requeue 4242"] and proc.returncode == 0
    assert "status 143: preempted by SIGUSR2 at step 7" in err
    assert not (tmp_path / "requeue-request").exists()


def test_a_chain_submits_the_same_script_after_this_job(tmp_path):
    """CONTINUE=chain: no requeue; sbatch of this script with its arguments, after this
    job, as a fresh submission (no SLURM_* of this job but SLURM_CONF) naming the run."""
    proc = batch_shell(tmp_path, 75, CONTINUE="chain")
    _, err = signal_batch_shell(proc)
    assert proc.returncode == 0, err
    assert calls(tmp_path) == []
    assert calls(tmp_path, "sbatch") == [
        f"--parsable --dependency=afterany:4242 {tmp_path / 'job.sh'} --epochs 5 x"]
    env = dict(line.split("=", 1) for line in (tmp_path / "sbatch.env").read_text().split("\n")
               if "=" in line)
    assert env["TRAIN_RUN_ID"] == "4242" and env["SLURM_CONF"] == "/x.conf"
    assert "SLURM_JOB_ID" not in env and "SLURM_SUBMIT_DIR" not in env
    assert "time-limit: continuing run 4242 in job 4343 (1 of 2)" in err


@pytest.mark.parametrize("setting, value", [("CONTINUE", "resubmit"),
                                            ("MAX_PREEMPTIONS", "many"),
                                            ("TRAIN_RUN_ID", "../x")])
def test_a_bad_setting_stops_before_the_step(tmp_path, setting, value):
    proc = batch_shell(tmp_path, 0, **{setting: value})
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 2 and out == ""
    assert err.startswith(f"requeue: {setting}={value}: expected")
