"""A hung job on the real private SLURM cluster (tests/slurm): a 4-rank train over 2 nodes
dumps every rank's stacks on `scancel --signal=USR1`; one rank frozen with SIGSTOP makes
the other three write their stall dumps within the stall timeout, and `diagnose --json`
names it; the job, ended, is submitted again and resumes from its last checkpoint."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO, TINY, wait_for
from tests.slurm.jobs import job_field, sbatch, wait_until_ended

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

# 4 ranks of 16 images: 64 steps an epoch; --max-steps keeps the resumed run short.
ARGS = [*TINY, "--dataset", "synthetic", "--synthetic-size", "4096", "--image-size", "16",
        "--num-classes", "4", "--batch-size", "16", "--epochs", "1", "--seed", "4",
        "--precision", "fp32", "--checkpoint-every", "4", "--dist-timeout", "120",
        "--stall-timeout", "3", "--max-steps", "24"]

JOB = """#!/usr/bin/env bash
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=2
#SBATCH --time=10
set -Eeuo pipefail
srun --kill-on-bad-exit=1 train {args} --output-dir {out}
"""


def submit(cluster, folder: Path, out: Path) -> tuple[int, Path]:
    folder.mkdir(exist_ok=True)
    script, log = folder / "job.sbatch", folder / "job.log"
    script.write_text(JOB.format(args=" ".join(ARGS), out=out))
    env = {**cluster.env, "PYTHONUNBUFFERED": "1",
           "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    return sbatch(cluster, [f"--output={log}", str(script)], env=env, cwd=folder), log


def heartbeat(folder: Path, rank: int) -> dict:
    try:
        return json.loads((folder / f"heartbeat-{rank}.json").read_text())
    except (OSError, ValueError):
        return {}


def text_of(path: Path) -> str:
    return path.read_text() if path.exists() else ""


def test_a_frozen_rank_is_named_and_the_run_resumes(slurm_cluster, tmp_path):
    out = tmp_path / "run"
    diagnostics = out / "diagnostics"
    job, log = submit(slurm_cluster, tmp_path / "first", out)
    wait_for(lambda: all(heartbeat(diagnostics, r).get("step", 0) >= 2 for r in range(4)),
             "every rank to train", log)

    # On demand, on a live job: every rank of every node writes its stacks.
    done = slurm_cluster.run(["scancel", "--signal=USR1", str(job)])
    assert done.returncode == 0, done.stderr
    wait_for(lambda: all("most recent call first" in text_of(diagnostics / f"rank-{r}.txt")
                         for r in range(4)), "the on-demand dumps", log)

    # Rank 3 (on the second node) freezes once a checkpoint is there.
    # Not while it is stalled itself: the first asynchronous save (its writer starting)
    # may hold every rank past the stall timeout on a loaded machine.
    wait_for(lambda: (out / "checkpoints" / "latest").exists()
             and not heartbeat(diagnostics, 3).get("stalled"), "a checkpoint", log)
    frozen = heartbeat(diagnostics, 3)
    os.kill(frozen["pid"], signal.SIGSTOP)
    try:
        wait_for(lambda: all(heartbeat(diagnostics, r).get("stalled") for r in range(3)),
                 "the others' stall dumps", log, timeout=60)
        assert all("stalled:" in text_of(diagnostics / f"rank-{r}.txt") for r in range(3))
        assert not heartbeat(diagnostics, 3).get("stalled")
        assert "no step done for" in log.read_text()  # each stalled rank's one line
        found = subprocess.run([sys.executable, "-m", "workload.diagnose", str(out), "--json"],
                               capture_output=True, text=True,
                               env={**os.environ, "PYTHONPATH": str(REPO)})
        assert found.returncode == 0, found.stderr
        verdict = json.loads(found.stdout)
        assert verdict["suspect_ranks"] == [3]
        assert verdict["ranks"]["3"]["host"] == "nid002"
        # The others wait in a collective (the flight recorder's open entry).
        assert all(verdict["ranks"][str(r)]["waiting_in"] for r in range(3)), verdict
    finally:
        os.kill(frozen["pid"], signal.SIGKILL)
    assert wait_until_ended(slurm_cluster, job, log) != "COMPLETED"
    last = (out / "checkpoints" / "latest").read_text().strip()

    # Submitted again, the run resumes from its last checkpoint and completes.
    again, again_log = submit(slurm_cluster, tmp_path / "again", out)
    assert wait_until_ended(slurm_cluster, again, again_log) == "COMPLETED"
    assert f"resumed from {out / 'checkpoints' / last}" in again_log.read_text()
    assert json.loads((out / "summary.json").read_text())["steps_run"] == 24
    assert job_field(slurm_cluster, again, "ExitCode") == "0:0"
