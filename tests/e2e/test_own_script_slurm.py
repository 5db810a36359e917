"""A user's own plain-DDP script (examples/plain_ddp.py, no trainer) on the private SLURM
cluster, through jobs/own-script.sbatch with the host's Python (RUNTIME=none):

- each of the three forms (per task through entrypoint.sh, torchrun per node, no
  entrypoint with workload.launch.setup()) on 2 nodes x 2 processes: world size 4, and
  every rank checks its all-reduce;
- preemption: USR2 to one rank only -> every rank stops at the same step, rank 0 saves
  once, both exit 75, jobs/lib/requeue.sh requeues the job, and the requeued job resumes
  from that checkpoint and completes.
"""

from __future__ import annotations

import os
import re
import signal
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO, wait_for
from tests.slurm.jobs import job_field, sbatch, wait_until_ended

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

EXAMPLE = REPO / "examples" / "plain_ddp.py"


def job_script(tmp_path: Path) -> Path:
    """jobs/own-script.sbatch without its GPU request (the test cluster has no GPUs)."""
    text = (REPO / "jobs" / "own-script.sbatch").read_text()
    body = "\n".join(line for line in text.splitlines() if not line.startswith("#SBATCH --gpus"))
    script = tmp_path / "own-script.sbatch"
    script.write_text(body + "\n")
    return script


def job_env(cluster, **settings: str) -> dict[str, str]:
    return {**cluster.env, "JOBS_DIR": str(REPO / "jobs"), "RUNTIME": "none",
            "GPUS_PER_NODE": "2", "SCRIPT": str(EXAMPLE), "PYTHONUNBUFFERED": "1",
            "PYTHONPATH": str(REPO),
            "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", **settings}


@pytest.mark.parametrize("form", ["per-task", "torchrun", "no-entrypoint"])
def test_own_script_in_each_form_on_two_nodes(slurm_cluster, tmp_path, form):
    log = tmp_path / "job.out"
    job = sbatch(slurm_cluster, ["--nodes=2", "--cpus-per-task=2", "--time=10",
                                 f"--output={log}", str(job_script(tmp_path)), "--steps", "3",
                                 "--output-dir", str(tmp_path / "run")],
                 env=job_env(slurm_cluster, FORM=form), cwd=tmp_path)
    state = wait_until_ended(slurm_cluster, job, log)
    text = log.read_text() if log.exists() else ""
    assert state == "COMPLETED", text[-4000:]
    ranks = sorted(int(r) for r in re.findall(r"^rank (\d) of 4: all_reduce 10 ok$", text,
                                              re.M))
    assert ranks == [0, 1, 2, 3], text[-4000:]
    assert "done: 3 steps on 4 processes" in text


def rank_pid(marker: str, procid: str) -> int | None:
    """The Python process of the example whose command line holds `marker` and whose
    SLURM_PROCID is `procid` (the test cluster's nodes are this machine)."""
    for proc in Path("/proc").iterdir():
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
            if "python" not in Path(argv[0].decode()).name or \
                    not any(marker.encode() in arg for arg in argv):
                continue
            environ = (proc / "environ").read_bytes().split(b"\0")
        except (OSError, ValueError):
            continue
        if f"SLURM_PROCID={procid}".encode() in environ:
            return int(proc.name)
    return None


def test_usr2_to_one_rank_saves_once_exits_75_and_the_requeued_job_continues(
        slurm_cluster, tmp_path):
    out, log = tmp_path / "run", tmp_path / "job.out"
    job = sbatch(slurm_cluster, ["--nodes=1", "--cpus-per-task=2", "--time=15",
                                 f"--output={log}", str(job_script(tmp_path)), "--steps", "40",
                                 "--step-time", "0.5", "--output-dir", str(out)],
                 env=job_env(slurm_cluster, FORM="no-entrypoint", MAX_TIME_LIMIT_RESTARTS="1"),
                 cwd=tmp_path)
    wait_for(lambda: log.exists() and "rank 1: training from step 0" in log.read_text(),
             "rank 1 to train", log)
    wait_for(lambda: rank_pid(str(out), "1") is not None, "rank 1's process", log)
    os.kill(rank_pid(str(out), "1"), signal.SIGUSR2)  # to rank 1 only
    wait_for(lambda: job_field(slurm_cluster, job, "Restarts") == "1"
             and job_field(slurm_cluster, job, "JobState") in ("COMPLETED", "FAILED"),
             "the requeued job to end", log, timeout=480)  # held back cred_expire (cluster.py)
    text = log.read_text()
    [step] = re.findall(r"^saved checkpoint at step (\d+)$", text, re.M)
    for rank in (0, 1):
        assert f"rank {rank}: preempted at step {step}, exiting 75" in text, text[-4000:]
    assert text.count("requeueing job") == 1
    assert f"resumed from step {step}" in text and "done: 40 steps on 2 processes" in text
    assert job_field(slurm_cluster, job, "JobState") == "COMPLETED", text[-4000:]
