"""Preemption in one process: the signal gives one checkpoint, the requeue status (75),
no traceback (Ctrl-C included), and a resumed run that ends bit-identical to an
uninterrupted one."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys

import pytest

from tests.helpers import TINY, started_writer_of, tmpfs
from workload.launch import REQUEUE_EXIT_STATUS

pytestmark = pytest.mark.slow  # every test here trains

ARGS = [*TINY, "--dataset", "synthetic", "--synthetic-size", "128", "--image-size", "16",
        "--num-classes", "4", "--batch-size", "16", "--epochs", "2", "--seed", "3",
        "--checkpoint-every", "0"]  # epoch ends only: the preemption save is the one mid-epoch
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def train(out, *extra, env=ENV) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "workload.train", *ARGS, *extra,
                             "--output-dir", str(out)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env)


def signal_when_training(proc: subprocess.Popen, signum: int) -> str:
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if "data backend" in line:
            proc.send_signal(signum)
            break
    lines.extend(proc.stdout)
    proc.wait(timeout=300)
    return "".join(lines)


def finish(out) -> dict:
    proc = train(out)
    log = proc.communicate(timeout=600)[0]
    assert proc.returncode == 0, log
    return json.loads((out / "summary.json").read_text())


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict:
    return finish(tmp_path_factory.mktemp("reference") / "run")


@pytest.mark.parametrize("signame, extra", [("SIGUSR2", []), ("SIGTERM", []),
                                             ("SIGUSR1", ["--preempt-signal", "USR1"]),
                                             ("SIGINT", [])])  # Ctrl-C
def test_signal_gives_one_checkpoint_the_requeue_status_and_an_exact_resume(
        signame, extra, reference, tmp_path):
    out = tmp_path / "run"
    # Sent as training starts (a later moment could miss a fast machine's whole run): the
    # flag is read at the first step boundary. Random moments: tests/e2e/test_resume_kill.py.
    proc = train(out, *extra)
    log = signal_when_training(proc, getattr(signal, signame))
    assert proc.returncode == REQUEUE_EXIT_STATUS == 75, log  # the documented constant
    assert f"status {REQUEUE_EXIT_STATUS}" in log, log
    # Ctrl-C (SIGINT) too ends without a traceback.
    assert "Traceback" not in log and "KeyboardInterrupt" not in log, log
    stopped = [line for line in log.splitlines() if f"preempted by {signame}" in line]
    assert stopped, log
    step = int(stopped[0].split("at step ")[1].split(":")[0])
    saves = [line for line in log.splitlines() if "checkpoint (preemption)" in line]
    assert len(saves) == 1 and f"step-{step:09d}" in saves[0]
    assert (out / "checkpoints" / "latest").read_text().strip() == f"step-{step:09d}"
    assert not (out / "summary.json").exists()
    assert finish(out)["model_sha256"] == reference["model_sha256"]


def test_a_signal_after_the_last_step_leaves_a_finished_run_finished(tmp_path):
    """--signal=B:USR2@300 can come while a finished run exits (the process group's teardown
    and torch's unloading take a second or more here): nothing is left to save, and the run
    must not die of the signal and fail its job."""
    proc = train(tmp_path / "run")
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if "train: done:" in line:
            assert proc.poll() is None, "the run exited before the late signal"
            proc.send_signal(signal.SIGUSR2)
            break
    lines.extend(proc.stdout)
    assert proc.wait(timeout=60) == 0, "".join(lines)
    assert (tmp_path / "run" / "summary.json").exists()


def test_hup_to_every_process_of_the_step_spares_the_writer_of_a_save_in_flight(tmp_path):
    """--preempt-signal HUP, sent as SLURM does to every process of the step, the
    asynchronous checkpoint writer included: it ignores the signal, the run saves, 75."""
    proc = train(tmp_path / "run", "--preempt-signal", "HUP", "--checkpoint-every", "1")
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if "handed to the writer" in line:
            for pid in (started_writer_of(proc.pid), proc.pid):
                os.kill(pid, signal.SIGHUP)
            break
    lines.extend(proc.stdout)
    proc.wait(timeout=300)
    log = "".join(lines)
    assert proc.returncode == REQUEUE_EXIT_STATUS, log
    assert "preempted by SIGHUP" in log and "writer process died" not in log, log


@pytest.mark.parametrize("where", ["missing", pytest.param("read-only", marks=pytest.mark.root)])
def test_a_requeue_file_that_cannot_be_written_is_one_warning_and_still_75(tmp_path, where):
    """TRAIN_REQUEUE_FILE in a folder that is missing or on a read-only mount: the
    checkpoint is committed, so the run ends with 75 and one warning, not a traceback."""
    folder = tmp_path / where
    with contextlib.ExitStack() as mounted:
        if where == "read-only":
            mounted.enter_context(tmpfs(folder, "ro"))
        requeue = folder / ".requeue"
        proc = train(tmp_path / "run", env={**ENV, "TRAIN_REQUEUE_FILE": str(requeue)})
        log = signal_when_training(proc, signal.SIGTERM)
        assert not requeue.exists()
    assert proc.returncode == REQUEUE_EXIT_STATUS, log
    assert "Traceback" not in log, log
    [warning] = [line for line in log.splitlines() if "TRAIN_REQUEUE_FILE" in line]
    assert warning.startswith(f"warning: TRAIN_REQUEUE_FILE {requeue}: cannot write it (") \
        and "the job script sees only the exit status 75" in warning, log
    step = int(log.split("preempted by SIGTERM at step ")[1].split(":")[0])
    assert (tmp_path / "run" / "checkpoints" / "latest").read_text() == f"step-{step:09d}\n"
