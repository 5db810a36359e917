"""A slow rank is named: two real processes under torchrun (gloo, CPU), one of them given
a noisy neighbour as its first step begins: it shares its CPU with a busy process that
has a larger share of it (the rank runs at nice 7), the other rank has a CPU of its
own. The warning names it with its host, and steps.jsonl shows it as the max of the
ranks' busy time in a clear majority of the intervals (three in four): the machine's
other load (a full run of the suite, other jobs) falls on either rank, so the slowed rank
is not the slowest in every interval, but the warning needs three intervals in a row. The
same run switches the collective timeout after its first step.

The kernel's scheduler does the slowing, so every part of the rank's steps is slowed
alike, as on a throttled GPU. A test process that stops and continues the rank in a loop
did not: it slows the rank only while the test itself gets a CPU, and stops that land in
the rank's backward (a collective, not counted as its own work) left whole intervals
looking unslowed."""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import TINY, clean_env, read_jsonl, wait_for

pytestmark = pytest.mark.slow

STEPS = 48  # 12 exchanges; the warning comes after the third
ARGS = [*TINY, "--dataset", "synthetic", "--synthetic-size", "4096", "--image-size", "16",
        "--num-classes", "4", "--batch-size", "16", "--epochs", "1", "--precision", "fp32",
        "--log-every", "4", "--max-steps", str(STEPS), "--checkpoint-every", "0",
        "--dist-timeout", "120", "--dist-start-timeout", "900"]
NICE = 7   # the slowed rank's niceness beside a busy process at 0: a sixth of a CPU
MAJORITY = 0.75  # of the intervals where the slowed rank is the slowest (the rest: load)


def set_nice(pid: int, nice: int) -> None:
    for thread in map(int, os.listdir(f"/proc/{pid}/task")):
        os.setpriority(os.PRIO_PROCESS, thread, nice)
    # torchrun starts every worker in a session of its own; where the kernel groups tasks
    # by session (autogroup, man 7 sched) a CPU is shared between the groups first, so the
    # rank's group takes the niceness too, or the rank would still get half the CPU.
    group = Path(f"/proc/{pid}/autogroup")
    if group.exists():
        group.write_text(str(nice))


def last_step(steps: Path) -> int:
    """The step of steps.jsonl's last line so far, 0 before the first."""
    found = re.findall(r'"step": (\d+)', steps.read_text()) if steps.exists() else []
    return int(found[-1]) if found else 0


@contextlib.contextmanager
def busy_cpu(cpu: int):
    """A process spinning on `cpu` until the block ends. It spins before the block starts:
    one started when the rank's training began took up to a second of a loaded machine to
    start spinning, and the rank's first intervals went unslowed."""
    neighbour = subprocess.Popen(
        [sys.executable, "-c", f"import os; os.sched_setaffinity(0, {{{cpu}}}); "
         "print('spinning', flush=True)\nwhile True: pass"], stdout=subprocess.PIPE, text=True)
    try:
        assert neighbour.stdout.readline().strip() == "spinning"
        yield
    finally:
        neighbour.kill()
        neighbour.wait()


@contextlib.contextmanager
def noisy_neighbour(pid: int, cpu: int):
    """Every thread of `pid` (threads it starts later inherit it) onto `cpu` at NICE,
    beside the process busy_cpu keeps spinning there, until the block ends."""
    for thread in map(int, os.listdir(f"/proc/{pid}/task")):
        os.sched_setaffinity(thread, {cpu})
    set_nice(pid, NICE)
    try:
        yield
    finally:
        with contextlib.suppress(ProcessLookupError, FileNotFoundError):  # the rank ended
            set_nice(pid, 0)  # its evaluation and exit at full speed: a shorter test


def test_a_slowed_rank_is_named_with_its_host(tmp_path):
    cpus = sorted(os.sched_getaffinity(0))
    assert len(cpus) >= 2, f"the test needs 2 CPUs, it has {cpus}"
    out, log = tmp_path / "run", tmp_path / "log.txt"
    beat = out / "diagnostics" / "heartbeat-1.json"  # written as the rank's training starts
    with open(log, "w") as stream:
        job = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone",
                                "--nproc-per-node=2", "-m", "workload.train", *ARGS,
                                "--output-dir", str(out)], stdout=stream,
                               stderr=subprocess.STDOUT, env=clean_env())
    steps = out / "steps.jsonl"
    try:
        with busy_cpu(cpus[-1]):
            wait_for(beat.exists, "rank 1's first heartbeat", log, 300, poll=0.02)
            with noisy_neighbour(json.loads(beat.read_text())["pid"], cpus[-1]):
                slowed_after = last_step(steps)  # a loaded machine's test reacts late
                wait_for(lambda: steps.exists()
                         and re.search(rf'"step": {STEPS}\b', steps.read_text()),
                         f"step {STEPS}", log, 480, poll=0.05)
        job.wait(timeout=120)
    finally:
        job.kill()
    text = log.read_text()
    assert job.returncode == 0, text[-3000:]
    # Two-phase timeouts: --dist-start-timeout, after the first step --dist-timeout.
    assert "collective timeout now 120 s" in text
    warnings = [line for line in text.splitlines() if "is slow" in line]
    assert len(warnings) == 1 and "rank 1 on " in warnings[0], text[-3000:]
    lines = [line for line in read_jsonl(out / "steps.jsonl") if "step_busy_max_rank" in line]
    assert all(len(line["step_busy_by_rank_s"]) == 2 for line in lines)
    assert len(lines) == STEPS // 4
    # The intervals that began once the rank was slowed: under load the test can see the
    # heartbeat a few steps late, and those steps ran at full speed.
    slowest = [line["step_busy_max_rank"] for line in lines if line["step"] - 4 >= slowed_after]
    assert len(slowest) >= STEPS // 4 - 3 and slowest.count(1) >= MAJORITY * len(slowest), (
        slowed_after, slowest)
