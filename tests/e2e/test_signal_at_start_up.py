"""A signal while a rank waits for its peers at start-up: the rendezvous blocks the main
thread in C++ for up to --dist-start-timeout, where no Python handler runs. SIGTERM and
Ctrl-C (SIGINT) must end `train` within seconds with the requeue status 75 (they are
preemption signals, and nothing has been trained to save), not after the timeout with
status 2. tests/e2e/test_preemption_slurm.py does the same under SLURM.

And a signal earlier still, while torch is imported (seconds; tens on a shared file
system): SLURM signals a step at any moment. The rendezvous tests above wait for the port,
which opens long after the handlers were installed, so none of them sent a signal before
the config was parsed, where SIGTERM killed the process (143, no line) and USR1 too."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import REPO, TINY, clean_env, free_port, listening

pytestmark = pytest.mark.slow

WAIT_S = 120  # --dist-start-timeout: far longer than the test lets the rank wait


TRAIN = [sys.executable, "-m", "workload.train", *TINY, "--dataset", "synthetic",
         "--synthetic-size", "64", "--max-steps", "1", "--dist-start-timeout", str(WAIT_S),
         "--dist-timeout", "30"]


def as_at_a_terminal() -> None:
    """SIGINT at its default, as a command typed at a terminal has it: a suite started in
    the background (`make test &`) passes it on ignored, and Ctrl-C would then mean nothing."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start_rank_0_alone(tmp_path, command=TRAIN, **env: str) -> tuple[subprocess.Popen, int]:
    """Rank 0 of 2, whose peer never comes: it waits in the rendezvous (its store's port
    is open once it does)."""
    port = free_port()
    env = {**clean_env(), "WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0",
           "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
           **env}
    if command is TRAIN:
        command = [*TRAIN, "--output-dir", str(tmp_path / "run")]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, preexec_fn=as_at_a_terminal)
    deadline = time.monotonic() + 120
    while not listening(port):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "rank 0 never opened its rendezvous port"
        time.sleep(0.2)
    time.sleep(1)  # inside the rendezvous's wait for rank 1
    return proc, port


@pytest.mark.parametrize("number", [signal.SIGTERM, signal.SIGINT], ids=["TERM", "INT"])
def test_a_signal_during_the_rendezvous_ends_train_at_once(tmp_path, number):
    requeue = tmp_path / ".requeue"
    proc, _ = start_rank_0_alone(tmp_path, TRAIN_REQUEUE_FILE=str(requeue))
    sent = time.monotonic()
    proc.send_signal(number)
    try:
        _, err = proc.communicate(timeout=20)
    finally:
        proc.kill()
    assert time.monotonic() - sent < 20
    assert proc.returncode == 75, err
    assert "Traceback" not in err and "could not join" not in err, err
    assert (f"{number.name} while waiting for the other ranks at start-up (rank 0 of 2): "
            "nothing to save; exiting with status 75") in err, err
    assert requeue.read_text() == f"preempted by {number.name} at start-up\n"
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_a_requeue_file_in_a_missing_folder_during_the_rendezvous_is_one_warning(tmp_path):
    """The watcher thread writes the requeue file: an error there left the rank waiting."""
    requeue = tmp_path / "missing" / ".requeue"
    proc, _ = start_rank_0_alone(tmp_path, TRAIN_REQUEUE_FILE=str(requeue))
    proc.send_signal(signal.SIGTERM)
    try:
        _, err = proc.communicate(timeout=20)
    finally:
        proc.kill()
    assert proc.returncode == 75, err
    assert f"warning: TRAIN_REQUEUE_FILE {requeue}: cannot write it (No such file or " \
        "directory)" in err and "Traceback" not in err, err


def test_sigterm_in_a_slurm_job_without_a_job_script_waits_for_slurm(tmp_path):
    """SLURM's preemption: a job that ends by itself in its grace time is not requeued
    (workload/launch/preemption.py), so the rank stays, as a training one does."""
    proc, _ = start_rank_0_alone(tmp_path, SLURM_JOB_ID="5")
    proc.send_signal(signal.SIGTERM)
    time.sleep(5)
    assert proc.poll() is None
    proc.kill()
    proc.communicate()


def test_a_stack_dump_asked_for_during_start_up_kills_nothing(tmp_path):
    """`scancel --signal=USR1` (docs/hangs.md) on a job still starting: train's dump
    handler is not set yet, and SIGUSR1's default action would end the rank."""
    proc, _ = start_rank_0_alone(tmp_path)
    proc.send_signal(signal.SIGUSR1)
    time.sleep(3)
    alive = proc.poll() is None
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=20)
    assert alive, err
    assert proc.returncode == 75, err


# bench at its smallest, waiting for its peer at start-up.
BENCH = ["bench", "train", "--device", "cpu", "--dataset", "synthetic", "--model", "wrn",
         "--width", "8", "--blocks-per-stage", "1", "--image-size", "16", "--dist-timeout",
         str(WAIT_S)]


def signalled_in_the_rendezvous(tmp_path, command: list[str], number: int,
                                **env: str) -> tuple[int, str]:
    """The console script `command` as rank 0 of 2 alone, sent `number` in the rendezvous:
    its exit status and stderr."""
    proc, _ = start_rank_0_alone(tmp_path, [console(command[0]), *command[1:]], **env)
    proc.send_signal(number)
    try:
        _, err = proc.communicate(timeout=20)
    finally:
        proc.kill()
    return proc.returncode, err


def test_ctrl_c_during_the_rendezvous_ends_bench_with_130(tmp_path):
    """bench has no preemption handling: Python's own Ctrl-C, which cannot run in C++."""
    status, err = signalled_in_the_rendezvous(tmp_path, BENCH, signal.SIGINT)
    assert status == 130, err
    assert "SIGINT while waiting for the other ranks at start-up (rank 0 of 2): exiting " \
           "with status 130" in err, err


@pytest.mark.parametrize("command", [BENCH, ["doctor", "--device", "cpu", "--timeout",
                                             str(WAIT_S)]], ids=["bench", "doctor"])
def test_sigterm_during_the_rendezvous_ends_every_command_with_75(tmp_path, command):
    """The commands that save nothing: their start-up flag, passed to the rendezvous as
    train's flag is, ends them there too, with the requeue status and one line."""
    requeue = tmp_path / ".requeue"
    status, err = signalled_in_the_rendezvous(tmp_path, command, signal.SIGTERM,
                                              TRAIN_REQUEUE_FILE=str(requeue))
    assert status == 75, err
    assert "SIGTERM while waiting for the other ranks at start-up (rank 0 of 2): nothing to " \
           "save; exiting with status 75" in err and "Traceback" not in err, err
    assert requeue.read_text() == "preempted by SIGTERM at start-up\n"


def start_and_signal_while_torch_imports(command: list[str], number: int,
                                         **env: str) -> subprocess.Popen:
    """`command` started, and `number` sent once libtorch is mapped into it: torch's
    import has begun (the config is not parsed yet) and is not over."""
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**clean_env(), **env}, preexec_fn=as_at_a_terminal)
    deadline = time.monotonic() + 60
    while not torch_loading(proc.pid):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "torch's import never began"
        time.sleep(0.002)
    proc.send_signal(number)
    return proc


def torch_loading(pid: int) -> bool:
    try:
        return "libtorch" in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


def console(name: str) -> str:
    return str(Path(sys.executable).parent / name)


@pytest.mark.parametrize("number", [signal.SIGTERM, signal.SIGUSR2, signal.SIGINT],
                         ids=["TERM", "USR2", "INT"])
def test_a_signal_while_torch_imports_ends_train_with_75_and_one_line(tmp_path, number):
    requeue, run = tmp_path / ".requeue", tmp_path / "run"
    proc = start_and_signal_while_torch_imports(
        [console("train"), *TINY, "--dataset", "synthetic", "--max-steps", "1",
         "--output-dir", str(run)], number, TRAIN_REQUEUE_FILE=str(requeue))
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 75, err
    assert err == (f"train: {number.name} during start-up: nothing to save; exiting with "
                   "status 75 so that the job is requeued\n"), err
    assert requeue.read_text() == f"preempted by {number.name} at start-up\n"
    assert not (run / "checkpoints").exists()


@pytest.mark.parametrize("command", [["bench", "train", *TINY[6:], "--dataset", "synthetic"],
                                     ["doctor", "--device", "cpu"]], ids=["bench", "doctor"])
def test_a_signal_while_torch_imports_ends_every_command_with_75(tmp_path, command):
    """The commands that save nothing: every signal SLURM sends a step ends them with the
    requeue status and one line, from their first line."""
    proc = start_and_signal_while_torch_imports(
        [console(command[0]), *command[1:]], signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 75, err
    assert err.endswith(f"{command[0]}: SIGTERM during start-up: nothing to save; exiting "
                        "with status 75 so that the job is requeued\n"), err
    assert "Traceback" not in err


def test_a_stack_dump_asked_for_while_torch_imports_kills_nothing(tmp_path):
    proc = start_and_signal_while_torch_imports(
        [sys.executable, "-m", "workload.train", *TINY, "--dataset", "synthetic",
         "--synthetic-size", "64", "--batch-size", "16", "--image-size", "16", "--max-steps", "1",
         "--output-dir", str(tmp_path / "run")],
        signal.SIGUSR1, PYTHONPATH=str(REPO))
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    assert (tmp_path / "run" / "summary.json").exists()


def test_a_preemption_signal_recorded_while_torch_imports_is_handed_to_the_loop(tmp_path):
    """--preempt-signal USR1: while the config is not parsed, USR1 may be the stack dump's
    or the preemption's, so it is recorded; train's own flag takes it over, and the loop
    saves at its first step and exits with 75."""
    run = tmp_path / "run"
    proc = start_and_signal_while_torch_imports(
        [console("train"), *TINY, "--dataset", "synthetic", "--synthetic-size", "64",
         "--batch-size", "16", "--image-size", "16", "--max-steps", "4", "--preempt-signal",
         "USR1", "--output-dir", str(run)],
        signal.SIGUSR1)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 75, out + err
    assert "preempted by SIGUSR1 at step" in out + err and "Traceback" not in err, out + err
    assert (run / "checkpoints" / "latest").exists()
