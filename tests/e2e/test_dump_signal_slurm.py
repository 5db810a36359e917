"""docs/hangs.md's `scancel --signal=USR1 JOBID` on a live job of the job scripts, on the
real private SLURM cluster, in both layouts: every rank appends its stacks to
rank-<N>.txt and the job trains on to the end. SLURM signals every process of the step,
torchrun included, which dies of SIGUSR1 unless it ignores it (and stops its workers for
any signal it handles), so the job scripts start the step with SIGUSR1 ignored; and each
rank's DataLoader worker, which leaves the signal to its rank (a worker that died of it
left its rank waiting for a batch: a hung job instead of a dump).

The step is held (SIGSTOP) once it trains and USR1 sent then, so the run need only be long
enough to be caught training: 300 steps a run, to outlast the heartbeat's 5-second look,
were about 3 CPU-seconds a rank more than 120 (55 against 44 CPU-seconds for the module on
the 2-core test machine, by process accounting)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO, TINY, wait_for
from tests.slurm.jobs import hold_step, job_field, sbatch, wait_until_ended

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

STEPS = 120  # seconds of training on the 2-core machine: long enough to be caught training
ARGS = [*TINY, "--dataset", "synthetic", "--synthetic-size", "8192", "--image-size", "16",
        "--num-classes", "4", "--batch-size", "8", "--epochs", "1", "--seed", "4",
        "--precision", "fp32", "--checkpoint-every", "0", "--dist-timeout", "120",
        "--log-every", "1", "--max-steps", str(STEPS), "--data-backend", "torch",
        "--workers", "1"]


def hold_once_training(cluster, job: int, log: Path) -> None:
    """SIGSTOP to every process of the step (torchrun too) once rank 0 logs a step (every
    rank is in the loop then: the step's all-reduce needs them all), so that the USR1 sent
    while it is held lands mid-run however fast the machine is."""
    wait_for(lambda: log.exists() and "train: step " in log.read_text(), "the job to train",
             log, poll=0.05)
    hold_step(cluster, job, log)


def dumped(folder: Path, rank: int) -> bool:
    path = folder / f"rank-{rank}.txt"
    return path.exists() and "most recent call first" in path.read_text()


@pytest.mark.parametrize("layout", ["per-task", "torchrun"])
def test_usr1_dumps_every_rank_and_the_job_trains_on(slurm_cluster, tmp_path, layout):
    text = (REPO / "jobs" / "multinode.sbatch").read_text()
    body = "\n".join(line for line in text.splitlines()
                     if not line.startswith(("#SBATCH --gpus", "#SBATCH --cpus")))
    script, log = tmp_path / "multinode.sbatch", tmp_path / "job.log"
    script.write_text(body + "\n")
    env = {**slurm_cluster.env, "JOBS_DIR": str(REPO / "jobs"), "RUNTIME": "none",
           "GPUS_PER_NODE": "2", "LAYOUT": layout, "PYTHONUNBUFFERED": "1",
           "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    job = sbatch(slurm_cluster, ["--nodes=1", "--cpus-per-task=2", "--time=10",
                                 f"--output={log}", str(script), *ARGS], env=env, cwd=tmp_path)
    out = tmp_path / "runs" / str(job)
    diagnostics = out / "diagnostics"
    hold_once_training(slurm_cluster, job, log)
    for name in ("USR1", "CONT"):  # the held processes take USR1 as they resume
        done = slurm_cluster.run(["scancel", f"--signal={name}", str(job)])
        assert done.returncode == 0, done.stderr
    wait_for(lambda: all(dumped(diagnostics, r) for r in range(2)), "the dumps", log,
             timeout=60)
    assert wait_until_ended(slurm_cluster, job, log) == "COMPLETED", log.read_text()[-3000:]
    assert job_field(slurm_cluster, job, "ExitCode") == "0:0"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps_run"] == STEPS and summary["world_size"] == 2
