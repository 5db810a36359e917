"""After SLURM's SIGTERM with no job script to requeue the job, the preempted process stays
until SLURM ends the step (so that SLURM requeues it); everywhere else it exits 75. And
the job scripts' run folder, which a chain's jobs share (TRAIN_RUN_ID)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from workload.launch import jobstep
from workload.launch.preemption import slurm_will_requeue

JOB = {"SLURM_JOB_ID": "81"}


@pytest.mark.parametrize("signal_name, env, waits", [
    ("SIGTERM", JOB, True),                                         # preempted, plain srun
    ("SIGTERM", {**JOB, "TRAIN_REQUEUE_FILE": "/r"}, False),        # a job script requeues
    ("SIGUSR2", JOB, False),                                        # time-limit warning
    ("SIGINT", JOB, False),                                         # Ctrl-C under srun --pty
    (None, JOB, False),                                             # another rank's signal
    ("SIGTERM", {}, False),                                         # not in a SLURM job
])
def test_who_waits_for_slurm(signal_name, env, waits):
    assert slurm_will_requeue(signal_name, env) is waits


WAITER = """
from workload.launch import PreemptionFlag, exit_for_requeue
flag = PreemptionFlag().install()
exit_for_requeue(3, "SIGTERM")
"""


def test_exit_for_requeue_stays_until_killed_inside_a_slurm_job(tmp_path):
    env = {**os.environ, **JOB, "PYTHONPATH": os.getcwd(), "PYTHONUNBUFFERED": "1"}
    env.pop("TRAIN_REQUEUE_FILE", None)
    proc = subprocess.Popen([sys.executable, "-c", WAITER], env=env, stdout=subprocess.PIPE,
                            text=True)
    assert "waiting for SLURM to end the step" in proc.stdout.readline()
    proc.send_signal(signal.SIGTERM)  # SLURM's second SIGTERM, at the end of the grace time
    with pytest.raises(subprocess.TimeoutExpired):
        proc.wait(timeout=1)
    proc.kill()  # SLURM's SIGKILL
    assert proc.wait(timeout=30) == -signal.SIGKILL


@pytest.mark.parametrize("env, folder", [
    ({"SLURM_JOB_ID": "90"}, "runs/90"),
    ({"SLURM_JOB_ID": "95", "TRAIN_RUN_ID": "90"}, "runs/90"),      # a chain's next job
])
def test_the_run_folder_is_the_first_jobs(env, folder):
    command = jobstep.train_command({**env, "PWD": "/w"}, [])
    assert command[command.index("--output-dir") + 1] == folder


@pytest.mark.parametrize("value", ["../x", "..", "a/b", "-rf"])
def test_a_run_id_that_is_not_a_name_is_refused(value):
    with pytest.raises(jobstep.JobError, match=f"TRAIN_RUN_ID={value}: expected"):
        jobstep.run_id({"SLURM_JOB_ID": "9", "TRAIN_RUN_ID": value})
