"""The decision after each step of a job script (docs/failures.md), on the private SLURM
cluster: jobs/own-script.sbatch (RUNTIME=none, a script of a few lines and no torch, so
each attempt costs a step launch) with TRAIN_RUN_DIR naming its run folder.

- A run that fails at the same step every time is restarted inside the allocation (no
  queue) until three attempts in a row wrote no new checkpoint, then stops with one line
  (the last step, the attempts, the last failure) and a non-zero status.
- A training of two nodes and a spare (three nodes, --no-kill) loses a node mid-run (its
  slurmd stopped, its rank killed, the node set DOWN) while the survivor's node-local
  checkpoint (--checkpoint-local) is newer than the run folder's: the step restarts on
  the spare in the same job, resumes from that copy, and the run ends with the weights
  of an uninterrupted one.
- A hang on one node of such a job (its processes frozen): the stall watchdog's dumps
  name it, the collective timeout ends the step, and the step restarts without it.
- A one-node job whose node is drained as its step fails is requeued with the node
  excluded, and starts elsewhere although the node is back in service.
- A training of two nodes, no spare and MIN_NODES=1 (doctor's preflight first finds both
  fit) whose rank 1 fails with a GPU error (CUDA's "unspecified launch failure"): the
  node is recorded and left behind, and the
  step shrinks onto the other node in the same job, ending bit for bit as a run resumed
  from the same checkpoint on one node.
- A run whose every job ends at a time limit with a new checkpoint is never stopped: a
  chain of five jobs (more than the former fixed cap of 3 time limits) ends COMPLETED,
  even with MAX_ATTEMPTS_WITHOUT_PROGRESS=1.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import sys
from pathlib import Path

import pytest

from tests.helpers import DOCTOR_FAST, REPO, TINY, wait_for
from tests.slurm.jobs import (frozen_step, hold_step, job_field, sbatch, step_pids,
                              wait_until_ended)

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

# The run's "training": `fail` checkpoints step 5 and fails after it, every time;
# `drain` (its first time) checkpoints step 1, then its node is drained, as a health check
# drains a node it finds broken, and it fails; then it finishes; `time-limits` asks the
# batch shell for its time-limit signal (as --signal=B:USR2@N sends it), checkpoints the
# next step when the signal comes through srun and asks for the requeue as train does,
# until step 4, where it finishes.
SCRIPT = """import os, pathlib, signal, subprocess, sys, time
mode, run = sys.argv[1], pathlib.Path(sys.argv[2])
(run / "checkpoints").mkdir(parents=True, exist_ok=True)
latest = run / "checkpoints" / "latest"
step = int(latest.read_text()[5:]) if latest.exists() else 0
print("attempt on", os.environ["SLURMD_NODENAME"], "from step", step, flush=True)
if mode == "fail":
    latest.write_text("step-000000005\\n")
    sys.exit("failed at step 6")
if mode == "drain" and step == 0:
    latest.write_text("step-000000001\\n")
    subprocess.run(["scontrol", "update", "NodeName=" + os.environ["SLURMD_NODENAME"],
                    "State=DRAIN", "Reason=health check failed"], check=True)
    sys.exit("the GPU fell off the bus")
if mode == "drain":
    sys.exit(0)
if step >= 4:
    sys.exit(0)
got = []
signal.signal(signal.SIGUSR2, lambda *_: got.append(1))
# SLURM passes the signal to every process of the step: scancel ignores it (as exec keeps).
subprocess.run(["scancel", "--batch", "--signal=USR2", os.environ["SLURM_JOB_ID"]], check=True,
               preexec_fn=lambda: signal.signal(signal.SIGUSR2, signal.SIG_IGN))
while not got:
    time.sleep(0.05)
latest.write_text(f"step-{step + 1:09d}\\n")
request = pathlib.Path(os.environ["TRAIN_REQUEUE_FILE"])
request.write_text(f"preempted by SIGUSR2 at step {step + 1}")
sys.exit(75)
"""


def job_script(folder: Path) -> Path:
    """jobs/own-script.sbatch without its GPU request and with 1 CPU (the test cluster's
    nodes have 2): in its header, which a chain's next job reads again."""
    text = (REPO / "jobs" / "own-script.sbatch").read_text()
    lines = [line.replace("--cpus-per-task=32", "--cpus-per-task=1")
             for line in text.splitlines() if not line.startswith("#SBATCH --gpus")]
    script = folder / "own-script.sbatch"
    script.write_text("\n".join(lines) + "\n")
    (folder / "step.py").write_text(SCRIPT)
    return script


def submit(cluster, folder: Path, mode: str, *options: str,
           **settings: str) -> tuple[int, Path, Path]:
    run, log = folder / "run", folder / "job.log"
    env = {**cluster.env, "JOBS_DIR": str(REPO / "jobs"), "RUNTIME": "none",
           "FORM": "no-entrypoint", "GPUS_PER_NODE": "1", "SCRIPT": str(folder / "step.py"),
           "TRAIN_RUN_DIR": str(run), "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(REPO),
           "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", **settings}
    job = sbatch(cluster, [*options, f"--output={log}", str(job_script(folder)), mode, str(run)],
                 env=env, cwd=folder)
    return job, run, log


def attempts(run: Path) -> list[dict]:
    path = run / "attempts.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_a_run_failing_at_the_same_step_restarts_here_then_stops(slurm_cluster, tmp_path):
    job, run, log = submit(slurm_cluster, tmp_path, "fail")
    assert wait_until_ended(slurm_cluster, job, log) == "FAILED", log.read_text()[-3000:]
    text = log.read_text()
    assert job_field(slurm_cluster, job, "ExitCode") == "1:0"
    assert job_field(slurm_cluster, job, "Restarts") == "0"  # never through the queue
    assert text.count("decision: restart on ") == 3, text[-3000:]
    assert ("decision: stop: no new checkpoint in 3 attempt(s) in a row (last checkpoint: "
            "step 5); last failure: status 1") in text
    records = attempts(run)
    assert [(r["action"], r["without_progress"]) for r in records] == [
        ("restart", 0), ("restart", 1), ("restart", 2), ("stop", 3)]
    shown = slurm_cluster.run([str(Path(sys.executable).parent / "diagnose"), str(run)]).stdout
    assert "attempts: 4; the last decision: job" in shown and "stop: no new checkpoint" in shown


def test_a_time_limit_chain_that_progresses_is_never_stopped(slurm_cluster, tmp_path):
    job, run, log = submit(slurm_cluster, tmp_path, "time-limits", CONTINUE="chain",
                           MAX_ATTEMPTS_WITHOUT_PROGRESS="1")

    def finished() -> bool:
        records = attempts(run)
        return bool(records) and records[-1]["action"] in ("done", "stop")

    wait_for(finished, "the chain to end", log, timeout=300)
    records = attempts(run)
    assert [(r["ending"], r["action"], r["checkpointed"]) for r in records] == [
        *[("time-limit", "requeue", step) for step in range(1, 5)], ("finished", "done", 4)]
    jobs = [int(r["job"]) for r in records]
    assert jobs[0] == job and len(set(jobs)) == 5  # a new job of the chain each time
    last_log = tmp_path / f"hpc-train-own-script-{jobs[-1]}.out"
    assert wait_until_ended(slurm_cluster, jobs[-1], last_log) == "COMPLETED"


def test_a_requeued_job_never_starts_on_the_node_left_behind(slurm_cluster, tmp_path):
    """A one-node job whose node is drained as its step fails: the decision records the
    node, sets the job's ExcNodeList and requeues it (no spare in the allocation). The
    node is put back in service at once, so only the exclusion keeps the requeued job
    off it."""
    job, run, log = submit(slurm_cluster, tmp_path, "drain", "--nodes=1")
    try:
        wait_for(lambda: (run / "bad-nodes.jsonl").exists(), "the bad node's record", log)
        wait_for(lambda: job_field(slurm_cluster, job, "Restarts") == "1", "the requeue", log)
    finally:  # the session's cluster: every node back in service for the later tests
        for node in slurm_cluster.nodes:
            slurm_cluster.back_in_service(node)
    bad = json.loads((run / "bad-nodes.jsonl").read_text())["node"]
    assert wait_until_ended(slurm_cluster, job, log) == "COMPLETED", log.read_text()[-3000:]
    text = log.read_text()
    assert f"leaving {bad} behind: excluded from the requeued job" in text
    assert job_field(slurm_cluster, job, "ExcNodeList") == bad, text[-3000:]
    ran_on = re.findall(r"^attempt on (\S+) from step (\d+)$", text, re.M)
    assert ran_on[0] == (bad, "0") and ran_on[1][0] != bad, text[-3000:]
    assert [r["action"] for r in attempts(run)] == ["requeue", "done"]
    listed = slurm_cluster.run([str(Path(sys.executable).parent / "diagnose"), str(run),
                                "--bad-nodes"]).stdout
    assert listed.startswith(f"bad node: {bad}: SLURM says it is down (job {job}, ")


# The training of the lost-node test: 2 ranks, 3 epochs of 24 steps each, a checkpoint
# every 4 steps (jobs/requeue.sbatch's train, RUNTIME=none, one process per node).
TRAIN_ARGS = [*TINY, "--dataset", "synthetic", "--synthetic-size", "768", "--image-size", "16",
              "--num-classes", "4", "--batch-size", "16", "--epochs", "3", "--seed", "4",
              "--precision", "fp32", "--checkpoint-every", "4", "--dist-timeout", "120"]


def train_job(cluster, folder: Path, *options: str, args: tuple[str, ...] = (),
              **settings: str) -> tuple[int, Path, Path]:
    """jobs/requeue.sbatch (RUNTIME=none) without its GPU request, 2 CPUs a task, run
    from `folder`: its run folder is folder/runs/<job id>."""
    folder.mkdir(exist_ok=True)
    text = (REPO / "jobs" / "requeue.sbatch").read_text()
    script = folder / "requeue.sbatch"
    script.write_text("\n".join(line.replace("--cpus-per-task=32", "--cpus-per-task=2")
                                for line in text.splitlines()
                                if not line.startswith("#SBATCH --gpus")) + "\n")
    log = folder / "job.log"
    env = {**cluster.env, "JOBS_DIR": str(REPO / "jobs"), "RUNTIME": "none",
           "GPUS_PER_NODE": "1", "PYTHONUNBUFFERED": "1",
           "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", **settings}
    job = sbatch(cluster, [*options, f"--output={log}", str(script), *TRAIN_ARGS, *args],
                 env=env, cwd=folder)
    return job, folder / "runs" / str(job), log


def lose_node(cluster, job: int, node: str) -> None:
    """The node lost as it happens: its slurmd stops answering, its rank dies (SIGKILL),
    and SLURM marks it DOWN."""
    ranks = step_pids(cluster, job, node)
    assert ranks, f"no process of job {job}'s step on {node}"
    cluster.stop_node(node)
    for pid in ranks:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    done = cluster.run(["scontrol", "update", f"NodeName={node}", "State=DOWN",
                        "Reason=lost in a test"])
    assert done.returncode == 0, done.stderr


def newest_saved(latest: Path) -> int:
    """The step the run folder's `latest` names (0: none yet)."""
    text = latest.read_text().strip() if latest.exists() else ""
    return int(text[5:]) if re.fullmatch(r"step-[0-9]{9}", text) else 0


def test_a_node_lost_mid_run_continues_on_the_spare_bit_exact(slurm_cluster, tmp_path):
    """With --checkpoint-local: the survivor (rank 0's node, which the restart keeps)
    holds a newer checkpoint than the run folder, as when the step ended while it was
    being copied there, and the restarted step resumes from that copy."""
    job, run, log = train_job(slurm_cluster, tmp_path / "lost", "--partition=spares",
                              "--nodes=3", "--no-kill", SPARE_NODES="1",
                              args=("--checkpoint-local", str(tmp_path / "node-local")))
    checkpoints = run / "checkpoints"
    lost = slurm_cluster.nodes[1]
    try:
        wait_for(lambda: newest_saved(checkpoints / "latest") >= 8, "a second checkpoint",
                 log, poll=0.05)
        # Held (its checkpoint writer too): it cannot finish first.
        hold_step(slurm_cluster, job, log, slurm_cluster.nodes[0])
        # As if the step had ended while the newest was being copied into the run folder
        # (tests/e2e/test_checkpoint_local.py does the same): the run folder's newest is
        # the one before it, the node-local tier still has it.
        newest = newest_saved(checkpoints / "latest")
        (checkpoints / f"step-{newest:09d}").rename(checkpoints / f".tmp-step-{newest:09d}")
        (checkpoints / "latest").write_text(f"step-{newest - 4:09d}\n")
        lose_node(slurm_cluster, job, lost)
        assert wait_until_ended(slurm_cluster, job, log, timeout=300) == "COMPLETED", \
            log.read_text()[-4000:]
    finally:  # the session's cluster: the node back for the later tests
        slurm_cluster.start_node(lost)
        slurm_cluster.back_in_service(lost)
    text = log.read_text()
    assert f"spare node(s) kept for a restart: {slurm_cluster.spare}" in text
    assert (f"decision: restart on {slurm_cluster.nodes[0]},{slurm_cluster.spare}, leaving "
            f"{lost} behind") in text, text[-4000:]
    assert job_field(slurm_cluster, job, "Restarts") == "0"  # the same job, no queue
    assert (f"is newer than the run folder's newest checkpoint (step {newest - 4})"
            in text), text[-4000:]
    # The newest copy of the tier: that step, or one its writer committed there as it was held.
    resumed = re.search(rf"resumed from \S*runs/{job}/checkpoints/step-([0-9]+): ", text)
    assert resumed and int(resumed.group(1)) >= newest, text[-4000:]
    assert [r["action"] for r in attempts(run)] == ["restart", "done"]
    ref, ref_run, ref_log = train_job(slurm_cluster, tmp_path / "reference", "--nodes=2")
    assert wait_until_ended(slurm_cluster, ref, ref_log, timeout=300) == "COMPLETED"
    resumed = json.loads((run / "summary.json").read_text())
    reference = json.loads((ref_run / "summary.json").read_text())
    assert resumed["world_size"] == reference["world_size"] == 2
    assert resumed["model_sha256"] == reference["model_sha256"]


def test_a_hang_on_one_node_is_left_behind_and_the_run_continues(slurm_cluster, tmp_path):
    job, run, log = train_job(slurm_cluster, tmp_path, "--partition=spares", "--nodes=3",
                              "--no-kill", args=("--stall-timeout", "3", "--dist-timeout", "20"),
                              SPARE_NODES="1")
    hung = slurm_cluster.nodes[1]
    # Rank 1's node (the second) freezes once a checkpoint is there: every process of
    # its step there held, through the collective timeout that ends the step, until
    # SLURM kills them.
    wait_for((run / "checkpoints" / "latest").exists, "a checkpoint", log, poll=0.05)
    with frozen_step(slurm_cluster, job, hung):
        assert wait_until_ended(slurm_cluster, job, log, timeout=300) == "COMPLETED", \
            log.read_text()[-4000:]
    text = log.read_text()
    assert (f"decision: restart on {slurm_cluster.nodes[0]},{slurm_cluster.spare}, leaving "
            f"{hung} behind") in text, text[-4000:]
    records = attempts(run)
    assert [r["action"] for r in records] == ["restart", "done"]
    # The frozen rank is the one named, for the reason the machine's pace allows: rank 0
    # dumps its stall (and rank 1 is the one without a dump) when its stall limit, the
    # flag's 3 s or 10 median steps, comes before the collective's 20 s timeout ends it;
    # on a loaded machine 10 steps take longer, and diagnose reads the collective each
    # rank last entered instead (workload/diagnose/verdict.py, watchdog.Watchdog.__exit__).
    assert records[0]["verdict"] in ("rank 1 wrote no stall dump while the others did",
                                     "rank 1 did not enter the collective the others wait in")
    bad = [json.loads(line) for line in (run / "bad-nodes.jsonl").read_text().splitlines()]
    assert [(b["node"], b["why"].split(":")[0]) for b in bad] == [(hung, "diagnose")]
    assert job_field(slurm_cluster, job, "Restarts") == "0"


# A broken GPU as PyTorch shows it: a CUDA op of the rank raises. Python runs this file
# (sitecustomize, found on PYTHONPATH) in every process of the job; in train's processes
# on the node named, the step's 10th backward pass raises CUDA's error.
BROKEN_GPU = """import os
if os.environ.get("SLURMD_NODENAME") == os.environ.get("BROKEN_GPU_NODE"):
    import torch
    backward, passes = torch.Tensor.backward, []

    def broken(self, *args, **kwargs):
        passes.append(1)
        if len(passes) == 10:
            raise RuntimeError("CUDA error: unspecified launch failure")
        return backward(self, *args, **kwargs)
    torch.Tensor.backward = broken
"""


def test_a_gpu_error_leaves_its_node_behind_and_the_run_shrinks(slurm_cluster, tmp_path):
    """Two nodes, no spare, MIN_NODES=1: rank 1's GPU fails at step 10; its node is
    recorded and left behind, and the step goes on on the other node alone, resuming the
    2-rank checkpoint in 1 rank. It ends with the weights of a run that trained in 2 ranks
    to that checkpoint (--max-steps) and was resumed in 1 (docs/checkpoints.md#another-
    number-of-processes)."""
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(BROKEN_GPU)
    broken = slurm_cluster.nodes[1]
    job, run, log = train_job(slurm_cluster, tmp_path / "shrunk", "--nodes=2", "--no-kill",
                              args=("--epochs", "1"), MIN_NODES="1", BROKEN_GPU_NODE=broken,
                              PYTHONPATH=str(tmp_path / "site"), PREFLIGHT="1",
                              PREFLIGHT_ARGS=" ".join(DOCTOR_FAST))
    assert wait_until_ended(slurm_cluster, job, log, timeout=300) == "COMPLETED", \
        log.read_text()[-4000:]
    text = log.read_text()
    # doctor's preflight ran on both nodes first, and found them fit: its GPU breaks later.
    report = json.loads((tmp_path / "shrunk" / f".train-preflight-{job}.json").read_text())
    assert sorted(place["node"] for place in report["ranks"]) == list(slurm_cluster.nodes)
    assert ("decision: restart on " + ",".join(slurm_cluster.nodes)
            + ": doctor's preflight found every node fit") in text, text[-4000:]
    why = "rank 1 failed with a GPU error: RuntimeError: CUDA error: unspecified launch failure"
    assert (f"decision: shrink on {slurm_cluster.nodes[0]}, leaving {broken} behind: status "
            f"1; diagnose: {why}") in text, text[-4000:]
    bad = [json.loads(line) for line in (run / "bad-nodes.jsonl").read_text().splitlines()]
    assert [(b["node"], b["why"], b["job"]) for b in bad] == [(broken, why, str(job))]
    records = attempts(run)
    assert [r["action"] for r in records] == ["shrink", "done"]
    assert job_field(slurm_cluster, job, "Restarts") == "0"  # the same job, no queue
    step = records[0]["checkpointed"]
    assert step and re.search(rf"resumed from \S*runs/{job}/checkpoints/step-0*{step}\b", text)
    # The reference: 2 ranks to that checkpoint, then 1 rank on from it, in the same folder.
    first, ref_run, ref_log = train_job(slurm_cluster, tmp_path / "reference", "--nodes=2",
                                        args=("--epochs", "1", "--max-steps", str(step)))
    assert wait_until_ended(slurm_cluster, first, ref_log, timeout=300) == "COMPLETED"
    then, _, ref_log = train_job(slurm_cluster, tmp_path / "reference", "--nodes=1",
                                 args=("--epochs", "1"), TRAIN_RUN_ID=str(first))
    assert wait_until_ended(slurm_cluster, then, ref_log, timeout=300) == "COMPLETED"
    shrunk = json.loads((run / "summary.json").read_text())
    reference = json.loads((ref_run / "summary.json").read_text())
    assert shrunk["world_size"] == reference["world_size"] == 1
    assert shrunk["model_sha256"] == reference["model_sha256"]
