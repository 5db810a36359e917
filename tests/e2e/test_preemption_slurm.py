"""Preemption on the real private SLURM cluster (tests/slurm): jobs/requeue.sbatch on 2
nodes, signalled the way `--signal=B:USR2@<seconds>` does it, checkpoints, exits 75, is
requeued by jobs/lib/requeue.sh, resumes from that step, stops requeueing at
MAX_TIME_LIMIT_RESTARTS, and a resubmission completes with the weights of an uninterrupted
job; under torchrun the requeued run completes. SLURM's own preemption (the `low` and
`high` partitions): a job script with CONTINUE=chain continues in the next job. With
DataLoader workers (an image folder and shards, at the default workers), SLURM's SIGTERM to
every process of the step, at a time limit, on `scancel` and at a preemption, leaves a
checkpoint of the step; a plain `exec srun train` job preempted is requeued by SLURM and
ends with the uninterrupted run's weights.

Each job here starts torch processes at about 3 CPU-seconds apiece (docs/development.md),
so one job carries as many of the module's cases as it can: the per-task requeue is the
cap test's first run, and the plain job's requeue is the DataLoader workers' preemption."""

from __future__ import annotations

import json
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.helpers import REPO, TINY, wait_for
from tests.slurm.jobs import ENDED_STATES, hold_step, job_field, sbatch, stop_step, wait_until_ended

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

# 2 epochs of 24 steps: long enough (seconds) that a signal sent once training has begun
# arrives before the run ends, even on a loaded machine.
ARGS = [*TINY, "--dataset", "synthetic", "--synthetic-size", "768", "--image-size", "16",
        "--num-classes", "4", "--batch-size", "16", "--epochs", "2", "--seed", "4",
        "--precision", "fp32", "--checkpoint-every", "0", "--dist-timeout", "120"]


def requeue_script(folder: Path) -> Path:
    """jobs/requeue.sbatch without its GPU request (the test cluster has none), with 2 CPUs a
    task and 10 minutes: in its header, which a chain's next job reads again."""
    header = {"#SBATCH --time=04:00:00": "#SBATCH --time=10",
              "#SBATCH --cpus-per-task=32": "#SBATCH --cpus-per-task=2"}
    text = (REPO / "jobs" / "requeue.sbatch").read_text()
    script = folder / "requeue.sbatch"
    script.write_text("\n".join(header.get(line, line) for line in text.splitlines()
                                if not line.startswith("#SBATCH --gpus")) + "\n")
    return script


def submit(cluster, folder: Path, layout: str, *options: str, log_name: str = "job.log",
           **settings: str) -> tuple[int, Path]:
    """requeue.sbatch (RUNTIME=none) on ARGS from `folder`: its run is folder/runs/<run id>,
    its log folder/<log_name> (appended to by a requeued job)."""
    folder.mkdir(exist_ok=True)
    log = folder / log_name
    env = {**cluster.env, "JOBS_DIR": str(REPO / "jobs"), "RUNTIME": "none",
           "LAYOUT": layout, "PYTHONUNBUFFERED": "1",
           "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", **settings}
    job = sbatch(cluster, [*options, f"--output={log}", str(requeue_script(folder)), *ARGS],
                 env=env, cwd=folder)
    return job, log


def log_count(log: Path, words: str) -> int:
    return log.read_text().count(words) if log.exists() else 0


def preempt_run_number(cluster, job: int, log: Path, n: int) -> None:
    """Wait until the n-th run of the job trains, then signal its batch shell only."""
    wait_for(lambda: log_count(log, "data backend") >= n, f"run {n} to train", log)
    done = cluster.run(["scancel", "--batch", "--signal=USR2", str(job)])
    assert done.returncode == 0, done.stderr


def test_usr2_checkpoints_requeues_resumes_and_stops_at_the_cap(slurm_cluster, tmp_path):
    """jobs/requeue.sbatch in the per-task layout on 2 nodes (one process each): USR2 to the
    batch shell, as `--signal=B:USR2@<seconds>` sends it, reaches train through srun; train
    checkpoints, exits 75 and jobs/lib/requeue.sh requeues the job (the same id), which
    resumes from that step; preempted again with MAX_TIME_LIMIT_RESTARTS=1 used up, it is
    not requeued; resubmitted with TRAIN_RUN_ID, as the log says, it completes with the
    weights of a job never interrupted. (The requeued run is the per-task layout's requeue
    case too: a job of its own for it cost 4 more torch processes.)"""
    per_task = ["--nodes=2"]
    settings = {"GPUS_PER_NODE": "1", "MAX_TIME_LIMIT_RESTARTS": "1"}
    job, log = submit(slurm_cluster, tmp_path, "per-task", *per_task, **settings)
    preempt_run_number(slurm_cluster, job, log, 1)
    wait_for(lambda: log_count(log, "requeueing job") == 1, "the requeue", log)
    first_step = int(re.search(r"preempted by SIGUSR2 at step (\d+)", log.read_text()).group(1))
    out = tmp_path / "runs" / str(job)
    assert (out / "checkpoints" / "latest").read_text().strip() == f"step-{first_step:09d}"

    # The requeued job (same id, restart count 1) resumes from that checkpoint ...
    preempt_run_number(slurm_cluster, job, log, 2)
    wait_for(lambda: job_field(slurm_cluster, job, "JobState") in ("FAILED", "COMPLETED"),
             "the job to end at the cap", log, timeout=480)  # requeued: held cred_expire
    text = log.read_text()
    assert job_field(slurm_cluster, job, "Restarts") == "1"
    # train names the folder as it was given: runs/<job id>, relative to the submit folder.
    assert re.search(rf"resumed from \S*runs/{job}/checkpoints/step-{first_step:09d}\b", text)
    # ... and, preempted again with MAX_TIME_LIMIT_RESTARTS=1 used up, is not requeued:
    # status 75.
    assert "not requeued" in text and log_count(log, "requeueing job") == 1
    assert f"resubmit the same script with TRAIN_RUN_ID={job}" in text
    assert job_field(slurm_cluster, job, "ExitCode") == "75:0"
    assert not (out / "summary.json").exists()

    # Submitting the same script again continues from the last checkpoint and completes,
    # with the same weights as a job that was never interrupted.
    last = (out / "checkpoints" / "latest").read_text().strip()
    again, again_log = submit(slurm_cluster, tmp_path, "per-task", *per_task,
                              log_name="again.log", TRAIN_RUN_ID=str(job), **settings)
    assert wait_until_ended(slurm_cluster, again, again_log) == "COMPLETED", \
        again_log.read_text()[-3000:]
    assert re.search(rf"resumed from \S*runs/{job}/checkpoints/{last}\b", again_log.read_text())
    ref, ref_log = submit(slurm_cluster, tmp_path / "reference", "per-task", *per_task,
                          **settings)
    assert wait_until_ended(slurm_cluster, ref, ref_log) == "COMPLETED", \
        ref_log.read_text()[-3000:]
    resumed = json.loads((out / "summary.json").read_text())
    reference = json.loads((tmp_path / "reference" / "runs" / str(ref) / "summary.json")
                           .read_text())
    assert resumed["world_size"] == reference["world_size"] == 2
    assert resumed["layout"] == "per-task"
    assert resumed["model_sha256"] == reference["model_sha256"]


def test_requeue_job_script_requeues_and_resumes_under_torchrun(slurm_cluster, tmp_path):
    """jobs/requeue.sbatch in the torchrun layout (one node, torchrun starting 2 processes):
    USR2 to the batch shell reaches train through srun and torchrun, the job is requeued
    once and the requeued run resumes from the checkpoint and completes."""
    job, log = submit(slurm_cluster, tmp_path, "torchrun", GPUS_PER_NODE="2",
                      MAX_TIME_LIMIT_RESTARTS="1")
    preempt_run_number(slurm_cluster, job, log, 1)
    wait_for(lambda: job_field(slurm_cluster, job, "JobState") in ("FAILED", "COMPLETED")
             and job_field(slurm_cluster, job, "Restarts") == "1", "the requeued run", log,
             timeout=480)  # SLURM holds a requeued job back for cred_expire (cluster.py)
    text = log.read_text()
    step = int(re.search(r"preempted by SIGUSR2 at step (\d+)", text).group(1))
    out = tmp_path / "runs" / str(job)
    assert log_count(log, "requeueing job") == 1
    assert re.search(rf"resumed from \S*runs/{job}/checkpoints/step-{step:09d}\b", text)
    assert job_field(slurm_cluster, job, "JobState") == "COMPLETED", text[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["world_size"] == 2
    assert summary["layout"] == "torchrun-per-node"


# Real preemption: the digits run (tiny, deterministic) of one task, 2 epochs of 90 steps:
# 2 to 3 s of training, which the test must catch to stop (a 30-step run, 0.4 s, ended
# before the stop reached it in one full run of the suite).
DIGITS_ARGS = [*TINY, "--dataset", "digits", "--image-size", "16", "--batch-size", "16",
               "--epochs", "2", "--seed", "3", "--precision", "fp32",
               "--checkpoint-every", "0", "--log-every", "10"]

# A user's own batch file, the way users write it: --requeue and `exec srun train`.
PLAIN_JOB = """#!/usr/bin/env bash
#SBATCH --nodes=1
#SBATCH --exclusive
#SBATCH --time=10
#SBATCH --requeue
#SBATCH --open-mode=append
echo "job start: restart count ${{SLURM_RESTART_COUNT:-0}}"
exec srun train {args} --output-dir {out}
"""


def preempt_while_training(cluster, job: int, log: Path, folder: Path) -> None:
    """Once the low job trains, a high-priority job that needs its node. The step is held
    with SIGSTOP first, so that a fast machine cannot finish the run before SLURM's
    decision (a few seconds) reaches it: SLURM's preemption sends SIGCONT with its
    SIGTERM (slurm.schedmd.com/preempt.html), which is what resumes it."""
    wait_for(lambda: log_count(log, "data backend") >= 1, "the low job to train", log,
             poll=0.05)
    hold_step(cluster, job, log)
    sbatch(cluster, ["--partition=high", "--nodes=1", "--exclusive",
                     f"--output={folder / 'high.log'}", "--wrap=true"])


def test_job_script_chain_continues_a_preempted_run_in_the_next_job(slurm_cluster, tmp_path):
    """CONTINUE=chain, for sites that forbid requeue: jobs/requeue.sbatch (RUNTIME=none)
    preempted on the low partition checkpoints, submits its successor with
    --dependency=afterany and ends; the successor (a new job id, the same run folder)
    resumes from the checkpoint and completes."""
    script = requeue_script(tmp_path)
    # SBATCH_PARTITION travels with the environment to the next job, as sbatch options do
    # not: the chain stays on the partition it was submitted to.
    env = {**slurm_cluster.env, "JOBS_DIR": str(REPO / "jobs"), "RUNTIME": "none",
           "GPUS_PER_NODE": "1", "CONTINUE": "chain", "SBATCH_PARTITION": "low",
           "PYTHONUNBUFFERED": "1", "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    job = sbatch(slurm_cluster, [str(script), *DIGITS_ARGS], env=env, cwd=tmp_path)
    log = tmp_path / f"hpc-train-requeue-{job}.out"
    preempt_while_training(slurm_cluster, job, log, tmp_path)
    wait_for(lambda: log_count(log, "continuing run") == 1, "the next job's submission", log)
    text = log.read_text()
    step = int(re.search(r"preempted by SIGTERM at step (\d+)", text).group(1))
    following = int(re.search(rf"preemption: continuing run {job} in job (\d+) \(1\)",
                              text).group(1))
    assert wait_until_ended(slurm_cluster, job, log) == "COMPLETED"
    assert job_field(slurm_cluster, job, "Restarts") == "0"
    following_log = tmp_path / f"hpc-train-requeue-{following}.out"
    assert wait_until_ended(slurm_cluster, following, following_log) == "COMPLETED"
    assert job_field(slurm_cluster, following, "Partition") == "low"
    assert re.search(rf"resumed from \S*runs/{job}/checkpoints/step-{step:09d}\b",
                     following_log.read_text())
    assert (tmp_path / "runs" / str(job) / "summary.json").exists()
    assert not (tmp_path / f".train-continuations-{job}").exists()  # done: counts forgotten


# Files read by DataLoader workers at their default count (1 on the cluster's nodes of 2
# CPUs), which SLURM signals with the rest of the step: the session's image folder of 8 px
# JPEGs and its shards, 2 epochs of 30 steps of 4 images (seconds of training).
FILE_ARGS = [*TINY, "--image-size", "8", "--batch-size", "4", "--epochs", "2", "--seed", "4",
             "--precision", "fp32", "--checkpoint-every", "0", "--log-every", "1"]
# PLAIN_JOB of one task, not the whole node: two of them share the low partition's node.
FILE_JOB = PLAIN_JOB.replace("#SBATCH --exclusive\n", "#SBATCH --ntasks=1\n")


@dataclass
class FileRun:
    """One job of a run on files: `kind` imagefolder or shards."""
    kind: str
    job: int
    log: Path
    node: str


@pytest.fixture
def file_data(shard_source, shard_folder) -> dict[str, list[str]]:
    return {"imagefolder": ["--dataset", "imagefolder", "--data-dir", str(shard_source)],
            "shards": ["--dataset", "shards", "--data-dir", str(shard_folder)]}


def submit_files(cluster, folder: Path, data: list[str], node: str, *options: str) -> int:
    """PLAIN_JOB on files into folder/run (a later job on the folder resumes it); a log of
    its own per job."""
    folder.mkdir(exist_ok=True)
    script, log = folder / "job.sbatch", folder / "job.log"
    script.write_text(FILE_JOB.format(args=" ".join([*FILE_ARGS, *data]), out=folder / "run"))
    env = {**cluster.env, "PYTHONUNBUFFERED": "1",
           "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    return sbatch(cluster, [f"--nodelist={node}", *options, f"--output={log}", str(script)],
                  env=env, cwd=folder)


def hold_once_stepping(cluster, runs: list[FileRun]) -> None:
    """SIGSTOP to each job's step once it has trained a step (its workers read the next
    batches then), both jobs watched at once: SLURM's SIGTERM comes with SIGCONT, which
    resumes the step, so a fast machine cannot end a run before SLURM signals it."""
    waiting = list(runs)

    def held_every_one() -> bool:
        for run in [run for run in waiting if log_count(run.log, "train: step ")]:
            stop_step(cluster, run.job, run.node)
            waiting.remove(run)
        return not waiting

    wait_for(held_every_one, "the jobs to train a step", runs[-1].log, poll=0.05)
    for run in runs:
        hold_step(cluster, run.job, run.log, run.node)


def saved_step(run: FileRun) -> int:
    """The step train saved after SLURM's SIGTERM, with DataLoader workers (the log names
    them), and no traceback."""
    text = run.log.read_text()
    workers = re.search(r"\((\d+) DataLoader workers\)", text)
    assert workers and int(workers.group(1)) >= 1, text[-3000:]
    assert "Traceback" not in text and "killed by signal" not in text, text[-3000:]
    found = re.search(r"preempted by SIGTERM at step (\d+): checkpoint written", text)
    assert found, text[-3000:]
    return int(found.group(1))


def test_a_step_ended_by_slurm_with_dataloader_workers_leaves_its_checkpoint(
        slurm_cluster, tmp_path, file_data):
    """At a time limit and on `scancel`, SLURM sends SIGCONT and SIGTERM to every process
    of the step, the DataLoader workers included, and SIGKILL KillWait (5 s) later: train
    on an image folder at its time limit and on shards cancelled (one job each, at once)
    saves the step it is in and waits for the end. A time limit of 1 minute costs a minute
    or more here (SLURM checks limits every 30 s), with the steps held. (Train meets the
    same SIGTERM from both endings and at a preemption, below, where both kinds of files
    are preempted: a job per ending and kind cost 2 more torch processes.)"""
    endings = {"imagefolder": ("--time=1", "TIMEOUT"), "shards": ("--time=10", "CANCELLED")}
    runs = [FileRun(kind, submit_files(slurm_cluster, tmp_path / kind, data, node,
                                       endings[kind][0]), tmp_path / kind / "job.log", node)
            for (kind, data), node in zip(file_data.items(), slurm_cluster.nodes)]
    hold_once_stepping(slurm_cluster, runs)
    cancelled = [str(run.job) for run in runs if endings[run.kind][1] == "CANCELLED"]
    done = slurm_cluster.run(["scancel", *cancelled])
    assert done.returncode == 0, done.stderr
    for run in runs:
        assert wait_until_ended(slurm_cluster, run.job, run.log) == endings[run.kind][1]
        latest = tmp_path / run.kind / "run" / "checkpoints" / "latest"
        assert latest.read_text().strip() == f"step-{saved_step(run):09d}"


def test_a_preempted_job_with_dataloader_workers_is_requeued_and_resumes(
        slurm_cluster, tmp_path, file_data):
    """SLURM's preemption (PreemptMode=REQUEUE with a grace time, tests/slurm/cluster.py)
    signals every process of the step, the DataLoader workers included: two plain
    `exec srun train` jobs on the low partition, on an image folder and on shards, are
    sent SIGTERM when a high-priority job needs their node; train checkpoints and stays
    until SLURM ends the step, so SLURM requeues each job, which resumes from the step it
    saved and completes. The shards' run ends with the weights of the same job never
    preempted (its samples and their augmentation are functions of the position,
    docs/your-data.md). (One test for the plain job and the workers: a third job of
    in-memory digits and its own reference cost 3 more torch processes and showed the same
    requeue; the chain test below preempts in-memory data.)"""
    node = slurm_cluster.nodes[0]
    runs = [FileRun(kind, submit_files(slurm_cluster, tmp_path / kind, data, node,
                                       "--partition=low"), tmp_path / kind / "job.log", node)
            for kind, data in file_data.items()]
    reference = tmp_path / "reference"
    submit_files(slurm_cluster, reference, file_data["shards"], slurm_cluster.nodes[1])
    hold_once_stepping(slurm_cluster, runs)
    sbatch(slurm_cluster, ["--partition=high", "--nodes=1", "--exclusive",
                           f"--output={tmp_path / 'high.log'}", "--wrap=true"])
    for run in runs:
        wait_for(lambda run=run: job_field(slurm_cluster, run.job, "JobState") in ENDED_STATES
                 and log_count(run.log, "job start") == 2, "the requeued job to end", run.log)
        text = run.log.read_text()
        assert job_field(slurm_cluster, run.job, "JobState") == "COMPLETED", text[-3000:]
        assert job_field(slurm_cluster, run.job, "Restarts") == "1"
        assert "waiting for SLURM to end the step" in text
        assert "job start: restart count 1" in text
        out = tmp_path / run.kind / "run"
        step = saved_step(run)
        assert f"resumed from {out / 'checkpoints' / f'step-{step:09d}'}" in text
    # The reference job ended minutes ago: its finished run's summary is the evidence, not
    # its state.
    wait_for((reference / "run" / "summary.json").exists, "the reference run to finish",
             reference / "job.log")
    resumed = json.loads((tmp_path / "shards" / "run" / "summary.json").read_text())
    expected = json.loads((reference / "run" / "summary.json").read_text())
    assert resumed["steps_run"] == expected["steps_run"]
    assert resumed["model_sha256"] == expected["model_sha256"]
