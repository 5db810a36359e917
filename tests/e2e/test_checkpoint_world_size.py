"""Checkpoints across a change of world size, and run folders free of pickles: gloo ranks
on the CPU started by hand (as a user would), DDP and FSDP.

A checkpoint written by 1 process resumes in 2 ranks, and one written by 2 ranks resumes
in 1 process: the resumed run starts from the saved step with the saved full parameters
(compared with the checkpoint's files joined into full tensors, FSDP's shards included),
then trains on. The data order after the change differs from an uninterrupted run by
design, so only the parameters at the resume are compared, not the final weights.

What is shared, to start fewer torch processes (each costs about 3 CPU-seconds): the
2-rank checkpoint is the one the 1-to-2 run itself writes as it trains on, so each
strategy's chain 1 -> 2 -> 1 shows both directions with 7 processes (12 under torchrun
before); that 2-rank run also writes rank 1's FSDP shards late
(tests/scripts/late_shard.py), which had a 2-rank run of its own.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.helpers import TESTS, TINY, clean_env, pickles_and_zips
from tests.helpers.ranks import finish_ranks, start_ranks
from workload.checkpoint.snapshot import read_checkpoint

pytestmark = pytest.mark.slow

# 1 epoch: 8 steps in 1 process, 4 in 2 ranks (128 images, 16 per rank and step).
ARGS = [*TINY, "--dataset", "synthetic", "--synthetic-size", "128", "--image-size", "16",
        "--num-classes", "4", "--batch-size", "16", "--epochs", "1", "--seed", "9",
        "--precision", "fp32", "--checkpoint-every", "2"]
TRAIN = ["-m", "workload.train"]
# A rank left alone (its partner failed) fails within 2 minutes instead of train's 30.
RANK_TIMEOUTS = ["--dist-start-timeout", "120", "--dist-timeout", "120"]
LATE_SHARD = [str(TESTS / "scripts" / "late_shard.py")]


def train(out: Path, nproc: int, *extra: str, program: list[str] = TRAIN) -> tuple[dict, str]:
    command = [sys.executable, *program, *ARGS, *extra, "--output-dir", str(out)]
    if nproc > 1:
        procs = start_ranks([*command, *RANK_TIMEOUTS], nproc)
        logs = finish_ranks(procs)
        codes, log = [p.returncode for p in procs], "\n".join(logs)
    else:
        done = subprocess.run(command, capture_output=True, text=True, timeout=600,
                              env={**clean_env(), "OMP_NUM_THREADS": "1"})
        codes, log = [done.returncode], done.stdout + done.stderr
    assert codes == [0] * nproc, log[-4000:]
    return json.loads((out / "summary.json").read_text()), log


def newest(out: Path) -> Path:
    root = out / "checkpoints"
    return root / (root / "latest").read_text().strip()


def check_saved(out: Path, log: str, world_size: int, strategy: str) -> None:
    """The newest checkpoint of the run that printed `log`: by `world_size` processes,
    sharded under FSDP only, saved asynchronously except FSDP's shards (said once)."""
    assert pickles_and_zips(out) == [], "every file is safetensors, JSON or text"
    saved = newest(out)
    manifest = json.loads((saved / "MANIFEST.json").read_text())
    assert manifest["world_size"] == world_size
    assert manifest["sharded"] == (strategy == "fsdp" and world_size > 1)
    said = log.count("per-rank checkpoint shards are saved synchronously")
    assert (said, "handed to the writer" in log) == \
        ((1, False) if manifest["sharded"] else (0, True)), log[-4000:]


def resumes_with_the_saved_parameters(out: Path, step: int, before: int, after: int,
                                      strategy: str, epochs: int) -> None:
    """The same epochs in `after` processes: nothing left to train, so the model written
    at the end is the checkpoint's, in full."""
    saved = newest(out)
    full = read_checkpoint(saved).model  # FSDP: every rank's shard joined
    _, log = train(out, after, "--strategy", strategy, "--epochs", str(epochs))
    assert f"resumed from {saved}: step {step}" in log and f"by {before} processes" in log
    from safetensors.torch import load_file

    final = load_file(out / "model.safetensors")
    assert final.keys() == full.keys()
    assert all(torch.equal(final[name], full[name]) for name in full), \
        "the resumed run must start from the saved full parameters"


def trains_on(out: Path, step: int, after: int, strategy: str, epochs: int,
              *extra: str, program: list[str] = TRAIN) -> str:
    """One epoch more in `after` processes: training continues from the saved step."""
    summary, log = train(out, after, "--strategy", strategy, "--epochs", str(epochs), *extra,
                         program=program)
    assert f"step {step}, epoch {epochs}, batch 0" in log
    assert summary["steps_run"] == step + 8 // after and summary["world_size"] == after
    assert pickles_and_zips(out) == []
    return log


def every_checkpoint_holds_every_shard(out: Path) -> None:
    """FSDP: rank 0 lists the shards into the manifest and renames the folder into place
    only once every rank has written its own."""
    saved = sorted((out / "checkpoints").glob("step-*"))
    assert saved
    for folder in saved:
        assert sorted(p.name for p in (folder / "shards").iterdir()) == [
            "rank-00000.json", "rank-00000.safetensors", "rank-00001.json",
            "rank-00001.safetensors"]
        read_checkpoint(folder)  # verifies every file against the manifest


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_resume_across_a_change_of_world_size(strategy, tmp_path):
    first = tmp_path / "one"  # one epoch in one process: 8 steps
    _, log = train(first, 1, "--strategy", strategy)  # a resume refuses another strategy
    check_saved(first, log, 1, strategy)
    # 1 -> 2 at step 8, then on to the end of epoch 2 (4 steps of 2 ranks: step 12).
    one_to_two = shutil.copytree(first, tmp_path / "1-to-2")
    resumes_with_the_saved_parameters(one_to_two, 8, 1, 2, strategy, epochs=1)
    two = shutil.copytree(first, tmp_path / "two")
    # Through late_shard.py (rank 1 writes its FSDP shard of every checkpoint half a second
    # late; nothing else changes), saving every step: the 3 kept are all this run's.
    log = trains_on(two, 8, 2, strategy, 2, "--checkpoint-every", "1", program=LATE_SHARD)
    check_saved(two, log, 2, strategy)
    if strategy == "fsdp":
        every_checkpoint_holds_every_shard(two)
    # 2 -> 1 at step 12, then on to the end of epoch 3 (8 steps of 1 process: step 20).
    two_to_one = shutil.copytree(two, tmp_path / "2-to-1")
    resumes_with_the_saved_parameters(two_to_one, 12, 2, 1, strategy, epochs=2)
    trains_on(two, 12, 1, strategy, epochs=3)
