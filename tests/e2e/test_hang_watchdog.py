"""The stall watchdog and diagnose on real runs: a rank of a 3-rank torchrun run (gloo,
CPU) frozen right after its first step, before any step was timed, gets the others'
stack dumps and stall lines within the stall timeout, and diagnose names it, leaving out
the heartbeat an earlier 4-rank attempt left in the folder; a finished run's last
heartbeat says so; when the run folder's file system hangs (frozen with fsfreeze), the
stall line still comes and names the folder; when the checkpoint writer is stopped, the
stall line names it."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import REPO, TINY, clean_env, ext4, started_writer_of, wait_for

pytestmark = pytest.mark.slow

STALL_S = 10
ARGS = [*TINY, "--dataset", "synthetic", "--synthetic-size", "4096", "--image-size", "16",
        "--num-classes", "4", "--batch-size", "16", "--epochs", "1", "--precision", "fp32",
        "--checkpoint-every", "0", "--stall-timeout", str(STALL_S), "--dist-timeout", "300",
        "--dist-start-timeout", "300"]


def diagnose(run_dir: Path) -> tuple[int, dict]:
    done = subprocess.run([sys.executable, "-m", "workload.diagnose", str(run_dir), "--json"],
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    return done.returncode, json.loads(done.stdout) if done.stdout else {"err": done.stderr}


def stalled(diagnostics: Path, rank: int) -> bool:
    with contextlib.suppress(OSError, ValueError):
        return json.loads((diagnostics / f"heartbeat-{rank}.json").read_text())["stalled"]
    return False


def plant_earlier_attempt(diagnostics: Path) -> None:
    """What a stalled 4-rank attempt before this one left for its rank 3."""
    diagnostics.mkdir(parents=True)
    beat = dict(rank=3, world_size=4, host="gone-node", pid=1, step=40, phase="optimizer",
                time=1.0, median_step_s=0.1, stalled=False, attempt=1.0)
    (diagnostics / "heartbeat-3.json").write_text(json.dumps(beat))


def test_a_rank_frozen_after_its_first_step_is_dumped_and_named(tmp_path):
    out, log, marker = tmp_path / "run", tmp_path / "log.txt", tmp_path / "frozen"
    diagnostics = out / "diagnostics"
    plant_earlier_attempt(diagnostics)
    env = clean_env() | {"FREEZE_MARKER": str(marker), "FREEZE_AT_STEP": "1",
                         "FREEZE_RANK": "2", "PYTHONPATH": str(REPO)}
    with open(log, "w") as stream:
        job = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone",
                                "--nproc-per-node=3", str(REPO / "tests/scripts/freeze_once.py"),
                                *ARGS, "--output-dir", str(out)], stdout=stream,
                               stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        wait_for(marker.exists, "rank 2 to freeze after its first step", log, 240, poll=0.1)
        frozen_at = time.monotonic()
        wait_for(lambda: stalled(diagnostics, 0) and stalled(diagnostics, 1),
                 "ranks 0 and 1 to write their stall dumps", log, 4 * STALL_S + 30)
        waited = time.monotonic() - frozen_at
        text = log.read_text()
        for rank in (0, 1):
            assert "stalled: no step done for" in (diagnostics / f"rank-{rank}.txt").read_text()
            assert f"rank {rank} on " in text and "no step done for" in text
        status, result = diagnose(out)
    finally:
        os.killpg(job.pid, signal.SIGKILL)
        job.wait()
        # torchrun starts each worker in a session of its own, out of the group killed
        # above; the others end when their peers do, but a stopped rank stays stopped.
        if marker.exists():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(marker.read_text()), signal.SIGKILL)
    assert STALL_S <= waited, waited
    assert status == 0 and result["suspect_ranks"] == [2], result
    assert "wrote no stall dump" in result["verdict"]
    assert set(result["ranks"]) == {"0", "1", "2"}
    assert result["left_out"] == ["the files of rank 3: not ranks of the newest attempt, "
                                  "which has 3"]


def test_a_finished_run_leaves_its_last_heartbeat(tmp_path):
    out = tmp_path / "run"
    done = subprocess.run(["train", *ARGS, "--synthetic-size", "256", "--max-steps", "6",
                           "--output-dir", str(out)], capture_output=True, text=True,
                          env=clean_env(), timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    beat = json.loads((out / "diagnostics" / "heartbeat-0.json").read_text())
    assert (beat["step"], beat["phase"], beat["stalled"]) == (6, "finished", False)
    found = subprocess.run(["diagnose", str(out)], capture_output=True, text=True,
                           env=clean_env(), timeout=60)
    assert found.returncode == 1
    assert "verdict: every rank finished" in found.stdout
    assert "step 6, phase finished" in found.stdout


@pytest.mark.root
def test_the_stall_line_comes_while_the_run_folders_file_system_hangs(tmp_path):
    """A hung Lustre or NFS server, as fsfreeze makes one: every write into the run folder
    blocks, the loop's steps.jsonl first (--log-every 1); the watchdog's heartbeat write
    too, but not its looks."""
    log = tmp_path / "log.txt"
    with ext4(tmp_path / "fs", tmp_path / "fs.img") as fs:
        diagnostics = fs / "run" / "diagnostics"
        with open(log, "w") as stream:
            job = subprocess.Popen(["train", *ARGS, "--stall-timeout", "4", "--epochs", "50",
                                    "--log-every", "1", "--output-dir", str(fs / "run")],
                                   stdout=stream, stderr=subprocess.STDOUT, env=clean_env(),
                                   start_new_session=True)
        try:
            wait_for(lambda: heartbeat_step(diagnostics) >= 2, "the run to step", log, 240)
            subprocess.run(["fsfreeze", "-f", str(fs)], check=True)
            hung = f"a write into {diagnostics} has hung for"
            wait_for(lambda: "no step done for" in log.read_text() and hung in log.read_text(),
                     "the stall line while the file system is frozen", log, 4 + 5 + 20)
        finally:  # thawed first: a process in a frozen write ends only after it
            subprocess.run(["fsfreeze", "-u", str(fs)], capture_output=True)
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()


def test_a_stopped_checkpoint_writer_is_named_by_the_stall_line(tmp_path):
    """The writer stopped (SIGSTOP, as a debugger or a frozen cgroup does) holds the loop
    at the save after the one it holds: the stall line names the writer and what to do,
    where it advised waiting for a collective timeout that never comes to one process;
    a preemption signal then leaves with 75 without that save."""
    out, log = tmp_path / "run", tmp_path / "log.txt"
    with open(log, "w") as stream:
        job = subprocess.Popen(["train", *ARGS, "--stall-timeout", "4", "--epochs", "50",
                                "--checkpoint-every", "4", "--output-dir", str(out)],
                               stdout=stream, stderr=subprocess.STDOUT, env=clean_env(),
                               start_new_session=True)
    writer = None
    try:
        wait_for(lambda: (out / "checkpoints" / "latest").exists(), "a first save", log, 240)
        writer = started_writer_of(job.pid)
        os.kill(writer, signal.SIGSTOP)
        named = f"waiting for the checkpoint writer (PID {writer}, state T: stopped) to commit"
        wait_for(lambda: any("no step done for" in line and named in line
                             for line in log.read_text().splitlines()),
                 "the stall line naming the stopped writer", log, 4 + 5 + 30)
        job.send_signal(signal.SIGTERM)
        job.wait(timeout=60)
    finally:
        with contextlib.suppress(ProcessLookupError):  # none left once it has ended
            os.killpg(job.pid, signal.SIGKILL)
        job.wait()
        if writer is not None:  # already ended with its parent, unless the test failed
            with contextlib.suppress(ProcessLookupError):
                os.kill(writer, signal.SIGKILL)
    text = log.read_text()
    [line] = [line for line in text.splitlines() if "no step done for" in line]
    assert f"kill -CONT {writer}" in line and "collective timeout" not in line, line
    assert job.returncode == 75, text[-3000:]
    assert f"SIGTERM while the checkpoint writer (PID {writer}, state T: stopped) held the " \
        "save of step" in text and "leaving without it" in text, text[-3000:]


def heartbeat_step(diagnostics: Path) -> int:
    with contextlib.suppress(OSError, ValueError):
        return json.loads((diagnostics / "heartbeat-0.json").read_text())["step"]
    return 0
