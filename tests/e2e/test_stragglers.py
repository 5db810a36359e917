"""A slow rank is named: two real processes under torchrun (gloo, CPU), one of them slowed
by stopping and continuing it in a loop; the warning names it with its host, and
steps.jsonl shows it as the max of the ranks' busy time per step. The same run switches
the collective timeout after its first step."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.helpers import TINY, clean_env, read_jsonl, wait_for

pytestmark = pytest.mark.slow

ARGS = [*TINY, "--dataset", "synthetic", "--synthetic-size", "4096", "--image-size", "16",
        "--num-classes", "4", "--batch-size", "16", "--epochs", "1", "--precision", "fp32",
        "--log-every", "4", "--max-steps", "96", "--checkpoint-every", "0",
        "--dist-timeout", "120", "--dist-start-timeout", "900",
        "--stall-timeout", "5"]  # heartbeats every second


def test_a_slowed_rank_is_named_with_its_host(tmp_path):
    out, log = tmp_path / "run", tmp_path / "log.txt"
    with open(log, "w") as stream:
        job = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone",
                                "--nproc-per-node=2", "-m", "workload.train", *ARGS,
                                "--output-dir", str(out)], stdout=stream,
                               stderr=subprocess.STDOUT, env=clean_env())
    beat = out / "diagnostics" / "heartbeat-1.json"
    try:
        wait_for(lambda: beat.exists() and json.loads(beat.read_text())["step"] >= 1,
                 "rank 1 to train", log, 120)
        slowed = json.loads(beat.read_text())["pid"]
        while job.poll() is None:  # rank 1 gets a fifth of the time it would have
            try:
                os.kill(slowed, signal.SIGSTOP)
                time.sleep(0.08)
                os.kill(slowed, signal.SIGCONT)
            except ProcessLookupError:  # rank 1 is done; torchrun ends next
                break
            time.sleep(0.02)
        job.wait(timeout=120)
    finally:
        job.kill() if job.poll() is None else None
    text = log.read_text()
    assert job.returncode == 0, text[-3000:]
    # Two-phase timeouts: --dist-start-timeout, after the first step --dist-timeout.
    assert "collective timeout now 120 s" in text
    warnings = [line for line in text.splitlines() if "is slow" in line]
    assert len(warnings) == 1 and "rank 1 on " in warnings[0], text[-3000:]
    lines = read_jsonl(out / "steps.jsonl")
    assert all(len(line["step_busy_by_rank_s"]) == 2 for line in lines[1:])
    # Busy times on a shared 2-core machine are noisy: rank 1 is the max in most intervals.
    slowest = [line["step_busy_max_rank"] for line in lines[1:]]
    assert slowest.count(1) > len(slowest) / 2, slowest
