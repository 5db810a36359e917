"""train's start-up phases, as a job starts it (`python -m workload.train` as a new
process): they add up to the wall time from the process's start to its first step as
seen from outside, and a rank that never reached its first step leaves a record from
which `diagnose` names the phase it was in."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from tests.helpers import DIGITS_RUN, clean_env, free_ports, local_rank_env
from workload.launch.diagnostics import STARTUP_PHASES

pytestmark = pytest.mark.slow


def train(out, env, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "workload.train", *DIGITS_RUN, *args,
                           "--output-dir", str(out)], env=env, capture_output=True,
                          text=True, timeout=600)


def test_the_phases_add_up_to_the_wall_time_to_the_first_step(tmp_path):
    out = tmp_path / "run"
    started = time.time()
    done = train(out, clean_env())
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads((out / "summary.json").read_text())["startup"]
    assert set(found["phases_s"]) == set(STARTUP_PHASES) and found["since"] == "process start"
    # cuDNN's autotuning is a phase of its own; on the CPU nothing is tuned: a moment.
    assert 0 <= found["phases_s"]["cudnn autotune"] < 1.0, found
    record = json.loads((out / "diagnostics" / "startup-rank-0.json").read_text())
    assert record["last_phase"] == "first step"
    seen_outside = record["at"] - started
    assert sum(found["phases_s"].values()) == pytest.approx(found["to_first_step_s"])
    assert abs(found["to_first_step_s"] - seen_outside) < 1.0, (found, seen_outside)
    assert "start-up since process start: imports " in done.stdout


def test_a_rank_stuck_in_its_start_is_named_with_its_phase_by_diagnose(tmp_path):
    """Rank 0 of two, rank 1 never started: rank 0 waits in the process group until
    --dist-start-timeout, and diagnose says where its start stopped."""
    out = tmp_path / "run"
    out.mkdir()  # as a requeued job finds it (train makes it only once the inputs are good)
    done = train(out, local_rank_env(0, 2, free_ports(1)[0]), "--dist-start-timeout", "5")
    assert done.returncode != 0, done.stderr[-3000:]
    verdict = subprocess.run([sys.executable, "-m", "workload.diagnose", str(out)],
                             capture_output=True, text=True, timeout=120)
    assert "rank 0" in verdict.stdout, verdict.stdout + verdict.stderr
    assert "start-up: finished imports at " in verdict.stdout
    assert "then in process group" in verdict.stdout, verdict.stdout
    # Its record keeps how the start failed, and where, for the decision after the step
    # (a GPU that fails as it is first used names its node: workload/diagnose/hardware.py).
    record = json.loads((out / "diagnostics" / "startup-rank-0.json").read_text())
    assert record["last_phase"] == "imports" and record["host"], record
    assert "timed out" in record["error"].lower() or "timeout" in record["error"].lower(), record
