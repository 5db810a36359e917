"""A signal while a rank of a SLURM job waits for its peers at start-up, on the real
private SLURM cluster: rank 1 of 2 never comes (it ignores the signals and sleeps), and
`scancel --signal=TERM` or `--signal=INT` to the step ends rank 0 within seconds, with
the requeue status and the requeue file, not after --dist-start-timeout with status 2.
tests/e2e/test_signal_at_start_up.py holds the same outside SLURM.

And `scancel --signal` while train still imports torch, before its config is parsed: the
rendezvous test waits for the port, long after the handlers were set, so it never sent a
signal there, where SIGTERM killed the task (143, no line) and USR1 too."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import TINY, free_port, listening, wait_for
from tests.slurm.jobs import ENDED_STATES, job_field, sbatch, step_pids

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

ARGS = [*TINY, "--dataset", "synthetic", "--synthetic-size", "64", "--max-steps", "1",
        "--dist-start-timeout", "300", "--dist-timeout", "30"]

JOB = """#!/usr/bin/env bash
#SBATCH --nodes=1
#SBATCH --ntasks=2
#SBATCH --time=10
export MASTER_PORT={port} TRAIN_REQUEUE_FILE={requeue}
srun --kill-on-bad-exit=1 bash -c \\
  'if [[ $SLURM_PROCID == 1 ]]; then trap "" TERM INT USR2; exec sleep 600; fi; exec "$@"' \\
  rank train {args} --output-dir {out}
echo "srun ended with status $?"
"""


@pytest.mark.parametrize("name", ["TERM", "INT"])
def test_a_signal_during_the_rendezvous_ends_the_rank_at_once(slurm_cluster, tmp_path, name):
    port, requeue = free_port(), tmp_path / ".requeue"
    script, log = tmp_path / "job.sbatch", tmp_path / "job.log"
    script.write_text(JOB.format(port=port, requeue=requeue, args=" ".join(ARGS),
                                 out=tmp_path / "run"))
    env = {**slurm_cluster.env, "PYTHONUNBUFFERED": "1",
           "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    job = sbatch(slurm_cluster, ["--nodelist=nid001", f"--output={log}", str(script)],
                 env=env, cwd=tmp_path)
    wait_for(lambda: listening(port, "nid001"), "rank 0 to wait in the rendezvous", log)
    time.sleep(1)

    sent = time.monotonic()
    done = slurm_cluster.run(["scancel", f"--signal={name}", str(job)])
    assert done.returncode == 0, done.stderr
    wait_for(lambda: job_field(slurm_cluster, job, "JobState") in ENDED_STATES,
             "the job to end", log, timeout=60)
    assert time.monotonic() - sent < 60
    text = log.read_text()
    assert (f"SIG{name} while waiting for the other ranks at start-up (rank 0 of 2): "
            "nothing to save; exiting with status 75") in text, text[-3000:]
    assert "could not join" not in text and "Traceback" not in text, text[-3000:]
    assert requeue.read_text() == f"preempted by SIG{name} at start-up\n"


ONE_TASK = """#!/usr/bin/env bash
#SBATCH --nodes=1
#SBATCH --ntasks=1
#SBATCH --time=10
export TRAIN_REQUEUE_FILE={requeue}
srun train {args} --batch-size 16 --image-size 16 --output-dir {out}
echo "srun ended with status $?"
"""


def importing_torch(cluster, job: int) -> bool:
    """A process of the job's step has libtorch mapped: torch's import has begun."""
    for pid in step_pids(cluster, job):
        try:
            if "libtorch" in Path(f"/proc/{pid}/maps").read_text():
                return True
        except OSError:
            continue
    return False


@pytest.mark.parametrize("name", ["TERM", "USR1"])
def test_a_signal_to_the_step_while_torch_imports(slurm_cluster, tmp_path, name):
    requeue, log = tmp_path / ".requeue", tmp_path / "job.log"
    script = tmp_path / "job.sbatch"
    script.write_text(ONE_TASK.format(requeue=requeue, args=" ".join(ARGS),
                                      out=tmp_path / "run"))
    env = {**slurm_cluster.env, "PYTHONUNBUFFERED": "1",
           "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    job = sbatch(slurm_cluster, ["--nodelist=nid001", f"--output={log}", str(script)],
                 env=env, cwd=tmp_path)
    wait_for(lambda: importing_torch(slurm_cluster, job), "train to import torch", log,
             poll=0.01)
    done = slurm_cluster.run(["scancel", f"--signal={name}", str(job)])
    assert done.returncode == 0, done.stderr
    wait_for(lambda: job_field(slurm_cluster, job, "JobState") in ENDED_STATES,
             "the job to end", log, timeout=120)
    text = log.read_text()
    assert "Traceback" not in text, text[-3000:]
    if name == "USR1":  # the stack dump's: nothing to dump yet, and nothing killed
        assert "srun ended with status 0" in text, text[-3000:]
        return
    assert ("train: SIGTERM during start-up: nothing to save; exiting with status 75 so "
            "that the job is requeued") in text, text[-3000:]
    assert "srun ended with status 75" in text, text[-3000:]
    assert requeue.read_text() == "preempted by SIGTERM at start-up\n"
