"""The jobs of a test on the private cluster: submit one, read its fields, wait until it
has ended, and hold or stop its first step's processes (the tests that hang or preempt)."""

from __future__ import annotations

import contextlib
import os
import re
import signal
from pathlib import Path

from tests.helpers import wait_for
from tests.helpers.hangs import frozen
from workload.files import proc_stat_fields

# The states a job ends in (a requeued job goes back to PENDING instead).
ENDED_STATES = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
                "BOOT_FAIL", "DEADLINE", "PREEMPTED"}


def sbatch(cluster, args: list[str], **kwargs) -> int:
    """Submit a job to the test cluster; its id."""
    done = cluster.run(["sbatch", "--parsable", *args], **kwargs)
    assert done.returncode == 0, done.stderr
    return int(done.stdout.strip().split(";")[0])


def wait_until_ended(cluster, job: int, log: Path, timeout: float = 240) -> str:
    """Poll until the job has ended; its final state. (Not `sbatch --wait`: that polls at
    doubling intervals and returns up to 30 s after the job ended.)"""
    wait_for(lambda: job_field(cluster, job, "JobState") in ENDED_STATES, f"job {job} to end",
             log, timeout)
    return job_field(cluster, job, "JobState")


def job_field(cluster, job: int, name: str) -> str:
    """One field of `scontrol show job` on the test cluster ("" when absent)."""
    done = cluster.run(["scontrol", "show", "job", str(job)])
    match = re.search(rf"\b{name}=(\S+)", done.stdout)
    return match.group(1) if match else ""


def step_pids(cluster, job: int, node: str | None = None) -> list[int]:
    """The processes SLURM lists for the job's first step on `node` (the first)."""
    done = cluster.run(["scontrol", "listpids", f"{job}.0", node or cluster.nodes[0]])
    return [int(line.split()[0]) for line in done.stdout.splitlines()[1:] if line.strip()]


def step_stopped(cluster, job: int, node: str | None = None) -> bool:
    """Every process of the job's first step on `node` (the first) is stopped (state T), or
    has exited and waits for its stopped parent to reap it (Z)."""
    states = []
    for pid in step_pids(cluster, job, node):
        if (fields := proc_stat_fields(pid)) is None:
            return False
        states.append(fields[0])
    return "T" in states and set(states) <= {"T", "Z"}


def stop_step(cluster, job: int, node: str | None = None) -> None:
    """SIGSTOP to every process of the job's first step on `node` (the first), sent by the
    test itself (root, on the nodes' machine), not `scancel --signal=STOP`: slurmctld marks
    the job STOPPED when slurmd's answer to a STOP request arrives, even once the job has
    ended (src/slurmctld/agent.c, SLURM 22.05 to master of 2026-08), so a STOP request in
    flight at a cancel leaves the cancelled job's JobState at STOPPED for good (6 of 10
    jobs in a loop here), and one in flight at a SIGCONT stops the step again."""
    signal_step(cluster, job, signal.SIGSTOP, node)


def signal_step(cluster, job: int, signum: int, node: str | None = None) -> None:
    """`signum` to every process of the job's first step on `node` (the first), by the
    test itself (stop_step says why not through SLURM)."""
    for pid in step_pids(cluster, job, node):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)


def frozen_step(cluster, job: int, node: str):
    """Every process of the job's first step on `node` held as a hung node holds them, a
    context (tests.helpers.hangs.frozen): SLURM's SIGCONT and SIGTERM at the step's end do
    not thaw them, its SIGKILL ends them."""
    return frozen(step_pids(cluster, job, node))


def hold_step(cluster, job: int, log: Path, node: str | None = None,
              unless=lambda: False) -> None:
    """SIGSTOP to every process of the job's first step on `node` (the first), sent again
    until every one is stopped: the step's processes are listed, then signalled, and one
    forked in between (the evaluation's DataLoader worker, at the end of a short epoch)
    runs on, never stopped, and the step is never held. SLURM's SIGCONT (with its SIGTERM
    at a cancel, a time limit or a preemption, or `scancel --signal=CONT`) resumes it.
    Given up as soon as `unless()` holds (the step may end or be resumed meanwhile)."""
    def stopped() -> bool:
        if unless():
            return True
        stop_step(cluster, job, node)
        return step_stopped(cluster, job, node)

    wait_for(stopped, "the step to stop", log)
