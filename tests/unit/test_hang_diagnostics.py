"""What a hung job leaves behind: the flight recorder's variables (a user's value wins, for
train and for a user's script through `launch env` and setup()), the stall watchdog's
heartbeat and dump, and `diagnose` naming the rank from a diagnostics folder."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.helpers import REPO, clean_env
from workload.checkpoint.stall import StallWatch
from workload.launch.diagnostics import apply_defaults, flight_recorder_env
from workload.launch.diagnostics import EXITED, FINISHED
from workload.training.run import watching
from workload.training.watchdog import (CHECKPOINT, COMPUTE, DATA, EVALUATION, HUNG_WRITE_S,
                                        STARTUP, Activity, StallWatchdog)


def test_flight_recorder_variables_keep_the_users_values(tmp_path):
    env = {"TORCH_NCCL_TRACE_BUFFER_SIZE": "500"}
    added = apply_defaults(env, tmp_path / "diagnostics")
    assert env["TORCH_NCCL_TRACE_BUFFER_SIZE"] == "500"  # the user's own value
    # ... under either of its names: torch 2.14 would take our TORCH_FR_BUFFER_SIZE first.
    assert "TORCH_NCCL_TRACE_BUFFER_SIZE" not in added and "TORCH_FR_BUFFER_SIZE" not in env
    # Dump on timeout, into the folder; 3, not 1, so the process lives to write the dump.
    env = {}
    apply_defaults(env, tmp_path / "diagnostics")
    assert env["TORCH_FR_BUFFER_SIZE"] == "2000"
    assert "TORCH_NCCL_TRACE_BUFFER_SIZE" not in env  # 2.14 warns about the old name
    assert env["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"
    assert env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "3"
    prefix = str(tmp_path / "diagnostics" / "fr-rank-")
    assert env["TORCH_FR_DUMP_TEMP_FILE"] == env["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] == prefix


def launch_env(command: str, cwd: Path, **extra: str) -> dict[str, str]:
    done = subprocess.run([sys.executable, "-m", "workload.launch", "env", "--command",
                           command], cwd=cwd, capture_output=True, text=True,
                          env={**clean_env(), "PYTHONPATH": str(REPO), **extra})
    assert done.returncode == 0, done.stderr
    return dict(line.split("=", 1) for line in done.stdout.splitlines()
                if line and not line.startswith("#"))


def test_launch_env_exports_them_for_a_users_script_not_for_train(tmp_path):
    values = launch_env("python", tmp_path)
    expected = flight_recorder_env(tmp_path / "diagnostics")
    assert {k: values[k] for k in expected} == expected
    assert (tmp_path / "diagnostics").is_dir()  # torch does not create it
    # train sets its own, into its --output-dir; a user's value is never overridden.
    assert "TORCH_FR_BUFFER_SIZE" not in launch_env("train", tmp_path)
    kept = launch_env("python", tmp_path, TORCH_NCCL_ASYNC_ERROR_HANDLING="1")
    assert "TORCH_NCCL_ASYNC_ERROR_HANDLING" not in kept


def test_watchdog_dumps_stacks_step_and_phase_once_when_no_step_completes(tmp_path):
    activity = Activity()
    dog = StallWatchdog(activity, tmp_path, rank=3, world_size=4, timeout_s=10.0)
    for step in range(1, 6):  # steps of 1 s: 10 x the median is 10 s
        activity.step, activity.phase = step, COMPUTE
        dog.check(dog.last_change + 1.0)
    activity.phase = DATA
    beat = json.loads((tmp_path / "heartbeat-3.json").read_text())
    assert (beat["rank"], beat["world_size"], beat["step"]) == (3, 4, 5)
    dog.check(dog.last_change + 9.0)
    assert not (tmp_path / "rank-3.txt").exists()  # within the timeout: nothing
    dog.check(dog.last_change + 11.0)
    dog.check(dog.last_change + 30.0)  # still stalled: one dump per stall
    text = (tmp_path / "rank-3.txt").read_text()
    assert text.count("stalled:") == 1
    assert "rank 3" in text and "step 5" in text and "phase data wait" in text
    assert "test_watchdog_dumps_stacks" in text  # the main thread's stack
    assert json.loads((tmp_path / "heartbeat-3.json").read_text())["phase"] == DATA


def test_the_heartbeat_is_written_when_the_watchdog_starts(tmp_path):
    with StallWatchdog(Activity(), tmp_path, rank=1, world_size=2, timeout_s=300.0):
        beat = json.loads((tmp_path / "heartbeat-1.json").read_text())
    assert (beat["step"], beat["phase"], beat["pid"]) == (0, STARTUP, os.getpid())


def test_one_step_seen_done_is_enough_for_the_stall_timeout(tmp_path):
    """13 steps done before the watchdog's first look, then a hang in the first
    checkpoint: no step was timed, and the flag's timeout alone applies."""
    activity = Activity()
    dog = StallWatchdog(activity, tmp_path, rank=2, world_size=3, timeout_s=30.0)
    activity.step, activity.phase = 13, CHECKPOINT
    dog.check(dog.last_change + 5.0)
    dog.check(dog.last_change + 29.0)
    assert not (tmp_path / "rank-2.txt").exists()
    dog.check(dog.last_change + 31.0)
    assert "stalled: no step done for 31 s" in (tmp_path / "rank-2.txt").read_text()
    beat = json.loads((tmp_path / "heartbeat-2.json").read_text())
    assert (beat["step"], beat["phase"], beat["stalled"]) == (13, CHECKPOINT, True)


def test_the_watchdog_looks_every_second_until_a_step_is_done(tmp_path):
    activity = Activity()
    dog = StallWatchdog(activity, tmp_path, rank=0, world_size=2, timeout_s=300.0)
    assert dog.next_look_s() == 1.0  # a rank frozen after 13 quick steps said "step 0"
    activity.step = 1
    dog.check(dog.last_change + 1.0)
    assert dog.next_look_s() == 5.0


def test_the_last_heartbeat_says_the_run_ended(tmp_path):
    activity = Activity()
    with StallWatchdog(activity, tmp_path, rank=0, world_size=1, timeout_s=300.0,
                       attempt=7.0):
        activity.step, activity.phase = 60, EVALUATION  # the end comes before a poll
    beat = json.loads((tmp_path / "heartbeat-0.json").read_text())
    assert (beat["step"], beat["phase"], beat["attempt"]) == (60, FINISHED, 7.0)
    with pytest.raises(KeyboardInterrupt), StallWatchdog(activity, tmp_path, 0, 1, 300.0):
        raise KeyboardInterrupt
    assert json.loads((tmp_path / "heartbeat-0.json").read_text())["phase"] == EXITED


def test_a_failed_ranks_last_heartbeat_names_its_error(tmp_path):
    """train's watch (training/run.py) hands the rank's exception to its last heartbeat,
    where diagnose's decision reads a broken GPU's error (workload/diagnose/hardware.py)."""
    error = "CUDA error: unspecified launch failure" + " (more)" * 80
    with pytest.raises(RuntimeError), watching(StallWatchdog(Activity(), tmp_path, 0, 1, 300.0)):
        raise RuntimeError(error)
    beat = json.loads((tmp_path / "heartbeat-0.json").read_text())
    assert beat["phase"] == EXITED
    assert beat["error"] == f"RuntimeError: {error}"[:400]


def test_the_stall_timeout_follows_slow_steps(tmp_path):
    activity = Activity()
    dog = StallWatchdog(activity, tmp_path, rank=0, world_size=1, timeout_s=5.0)
    for step in range(1, 4):  # 60 s steps: a stall is 600 s, not 5
        activity.step = step
        dog.check(dog.last_change + 60.0)
    # (t + 60) - t is 60 only up to the clock's magnitude: this failed at a small uptime.
    assert dog.limit_s() == pytest.approx(600.0)


def write_rank(folder: Path, rank: int, step: int, phase: str, stalled: bool,
               waiting: int | None = None) -> None:
    beat = dict(rank=rank, world_size=4, host=f"nid00{1 + rank // 2}", pid=100 + rank,
                step=step, phase=phase, time=0.0)
    (folder / f"heartbeat-{rank}.json").write_text(json.dumps(beat))
    if stalled:
        (folder / f"rank-{rank}.txt").write_text(
            f"stalled: no step done for 9 s; rank {rank}, step {step}, phase {phase}\n"
            "Thread 0x1 (most recent call first):\n"
            '  File "/x/distributed_c10d.py", line 10 in all_reduce\n'
            '  File "/x/train", line 8 in <module>\n\n')
    if waiting is not None:
        entries = [dict(collective_seq_id=waiting, profiling_name="gloo:all_reduce",
                        retired=False)]
        (folder / f"fr-rank-{rank}.json").write_text(json.dumps(dict(entries=entries)))


def diagnose(run_dir: Path) -> tuple[int, dict]:
    done = subprocess.run([sys.executable, "-m", "workload.diagnose", str(run_dir),
                           "--json"], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    return done.returncode, json.loads(done.stdout) if done.stdout else {}


def test_diagnose_names_the_rank_without_a_stall_dump(tmp_path):
    folder = tmp_path / "diagnostics"
    folder.mkdir()
    for rank in (0, 1, 3):
        write_rank(folder, rank, 8, COMPUTE, stalled=True, waiting=41)
    write_rank(folder, 2, 7, DATA, stalled=False)
    status, result = diagnose(tmp_path)
    assert status == 0 and result["suspect_ranks"] == [2]
    assert result["ranks"]["0"]["waiting_in"] == "gloo:all_reduce (collective 41)"
    assert result["ranks"]["2"]["phase"] == DATA


def test_diagnose_names_the_rank_behind_when_all_stalled_and_none_when_even(tmp_path):
    for rank in range(4):
        write_rank(tmp_path, rank, 8 if rank != 1 else 6, COMPUTE, stalled=True)
    assert diagnose(tmp_path)[1]["suspect_ranks"] == [1]
    write_rank(tmp_path, 1, 8, COMPUTE, stalled=True)
    status, result = diagnose(tmp_path)
    assert status == 1 and result["suspect_ranks"] == []


def test_diagnose_refuses_a_folder_without_diagnostics(tmp_path):
    done = subprocess.run([sys.executable, "-m", "workload.diagnose",
                           str(tmp_path / "nothing")], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 2 and "nothing" in done.stderr


@pytest.mark.slow
def test_train_called_twice_in_one_process_dumps_into_each_runs_own_folder(tmp_path,
                                                                          monkeypatch):
    """train sets the flight recorder's variables for its run only: left behind, they
    were a "user's value" to the next run in the process (and to every later command a
    test started), whose dumps then went into the first run's folder."""
    from tests.helpers import TINY
    from workload.train import train

    for key in flight_recorder_env(tmp_path):
        monkeypatch.delenv(key, raising=False)
    seen = []
    for name in ("first", "second"):
        out = tmp_path / name
        train([*TINY, "--dataset", "synthetic", "--synthetic-size", "64", "--batch-size", "16",
               "--max-steps", "1",
               "--output-dir", str(out)])
        seen.append({key: os.environ.get(key) for key in flight_recorder_env(out)})
    assert seen == [{key: None for key in flight_recorder_env(tmp_path)}] * 2
    monkeypatch.setenv("TORCH_FR_DUMP_TEMP_FILE", "/mine/fr-")  # a user's own value stays
    train([*TINY, "--dataset", "synthetic", "--synthetic-size", "64", "--batch-size", "16",
               "--max-steps", "1",
           "--output-dir", str(tmp_path / "third")])
    assert os.environ["TORCH_FR_DUMP_TEMP_FILE"] == "/mine/fr-"


def test_a_hung_write_holds_back_neither_the_stall_line_nor_the_looks(tmp_path, caplog):
    """A write into a hung file system (here: a job that waits) blocks the file writer's
    thread only; the looks go on, the stall line comes and a second names the folder."""
    activity, answered = Activity(), threading.Event()
    dog = StallWatchdog(activity, tmp_path, rank=0, world_size=1, timeout_s=10.0)
    dog.files.start()
    dog.files.submit("a hung write", answered.wait)
    while dog.files.busy_since is None:  # the writer has taken it
        time.sleep(0.01)
    activity.step = 1
    start = dog.last_change
    try:
        dog.check(start + 1.0)
        dog.check(start + 12.0)  # returns: nothing here waits for the file system
        assert "no step done for" in caplog.text
        # M3 (issue 59): one process has no collective whose timeout would end it.
        assert "collective timeout run" not in caplog.text
        assert (f"one process: no collective timeout will end it; if it does not go on, "
                f"stop it (Ctrl-C, scancel) and run: diagnose {tmp_path}") in caplog.text
        dog.check(time.monotonic() + HUNG_WRITE_S)
        assert f"a write into {tmp_path} has hung for" in caplog.text
        assert not (tmp_path / "rank-0.txt").exists()
    finally:
        answered.set()
        dog.files.close(timeout_s=10)
    assert "stalled: no step done for" in (tmp_path / "rank-0.txt").read_text()


def test_the_stall_line_names_the_checkpoint_writer_it_is_given(tmp_path):
    """The writer the loop waits for is handed to the watchdog (train: its checkpoint
    session's `waited_writer`), not found through a module global: the stall line names
    it while it is waited for, and advises the collective timeout otherwise."""
    waited: list[StallWatch] = []
    dog = StallWatchdog(Activity(), tmp_path, rank=0, world_size=2, timeout_s=300.0,
                        waited_writer=lambda: waited[0] if waited else None)
    assert dog.what_to_do().startswith("after the collective timeout run:")
    waited.append(StallWatch(os.getpid(), 6))
    assert dog.what_to_do().startswith(
        f"waiting for the checkpoint writer (PID {os.getpid()}, state ")
    assert "to commit step 6" in dog.what_to_do()


@pytest.mark.parametrize("ending, stalled", [("error", True), ("finished", False)])
def test_a_rank_that_ends_stalled_says_so_in_its_last_heartbeat(tmp_path, ending, stalled):
    """A rank stalled in a collective that then times out exits still stalled, so diagnose
    tells it from the rank that froze (by the stall dumps), whenever its exit comes; a run
    that finishes is stalled no more."""
    activity = Activity()
    dog = StallWatchdog(activity, tmp_path, rank=0, world_size=2, timeout_s=3.0)
    with contextlib.suppress(RuntimeError), dog:
        activity.step = 1
        dog.check(dog.last_change + 1.0)
        dog.check(dog.last_change + 4.0)  # the stall: dumped
        if ending == "error":
            raise RuntimeError("Connection closed by peer")
    beat = json.loads((tmp_path / "heartbeat-0.json").read_text())
    assert (beat["phase"], beat["stalled"]) == (EXITED if stalled else FINISHED, stalled)
