"""Checkpoints across a change of world size, and run folders free of pickles: gloo ranks
on the CPU under torchrun, DDP and FSDP.

A checkpoint written by 2 ranks resumes in 1 process and one written by 1 process resumes
in 2 ranks: the resumed run starts from the saved step with the saved full parameters
(compared with the checkpoint's files joined into full tensors, FSDP's shards included),
then trains on. The data order after the change differs from an uninterrupted run by
design, so only the parameters at the resume are compared, not the final weights.
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
from workload.checkpoint.snapshot import read_checkpoint

pytestmark = pytest.mark.slow

# 1 epoch: 8 steps in 1 process, 4 in 2 ranks (128 images, 16 per rank and step).
ARGS = [*TINY, "--dataset", "synthetic", "--synthetic-size", "128", "--image-size", "16",
        "--num-classes", "4", "--batch-size", "16", "--epochs", "1", "--seed", "9",
        "--precision", "fp32", "--checkpoint-every", "2"]
TRAIN = ["-m", "workload.train"]
LATE_SHARD = [str(TESTS / "helpers" / "late_shard.py")]


def train(out: Path, nproc: int, *extra: str, program: list[str] = TRAIN) -> tuple[dict, str]:
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                f"--nproc-per-node={nproc}"] if nproc > 1 else [sys.executable]
    done = subprocess.run([*launcher, *program, *ARGS, *extra,
                           "--output-dir", str(out)], capture_output=True, text=True,
                          timeout=600, env={**clean_env(), "OMP_NUM_THREADS": "1"})
    log = done.stdout + done.stderr
    assert done.returncode == 0, log[-4000:]
    return json.loads((out / "summary.json").read_text()), log


def newest(out: Path) -> Path:
    root = out / "checkpoints"
    return root / (root / "latest").read_text().strip()


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
@pytest.mark.parametrize("before, after", [(2, 1), (1, 2)], ids=["2-to-1", "1-to-2"])
def test_resume_across_a_change_of_world_size(strategy, before, after, tmp_path):
    out = tmp_path / "run"
    _, log = train(out, before, "--strategy", strategy)
    assert pickles_and_zips(out) == [], "every file is safetensors, JSON or text"
    saved = newest(out)
    manifest = json.loads((saved / "MANIFEST.json").read_text())
    assert manifest["world_size"] == before
    assert manifest["sharded"] == (strategy == "fsdp" and before > 1)
    # Asynchronous saves (the default), but FSDP's shards synchronously, said once.
    said = log.count("per-rank checkpoint shards are saved synchronously")
    assert (said, "handed to the writer" in log) == \
        ((1, False) if manifest["sharded"] else (0, True)), log[-4000:]
    full = read_checkpoint(saved).model  # FSDP: every rank's shard joined
    step = 8 // before
    again = tmp_path / "again"
    shutil.copytree(out, again)

    # The same epochs: nothing left to train; the model is the checkpoint's, in full.
    _, log = train(out, after, "--strategy", strategy)
    assert f"resumed from {saved}: step {step}" in log and f"by {before} processes" in log
    from safetensors.torch import load_file

    final = load_file(out / "model.safetensors")
    assert final.keys() == full.keys()
    assert all(torch.equal(final[name], full[name]) for name in full), \
        "the resumed run must start from the saved full parameters"

    # One epoch more: training continues from the saved step in the new world size.
    summary, log = train(again, after, "--strategy", strategy, "--epochs", "2")
    assert f"step {step}, epoch 2, batch 0" in log
    assert summary["steps_run"] == step + 8 // after and summary["world_size"] == after
    assert pickles_and_zips(again) == []


def test_every_checkpoint_holds_the_shard_of_a_rank_that_writes_late(tmp_path):
    """FSDP: rank 0 lists the shards into the manifest and renames the folder into place
    only once every rank has written its own (rank 1 here writes half a second late)."""
    out = tmp_path / "run"
    train(out, 2, "--strategy", "fsdp", "--checkpoint-every", "1", program=LATE_SHARD)
    saved = sorted((out / "checkpoints").glob("step-*"))
    assert saved
    for folder in saved:
        assert sorted(p.name for p in (folder / "shards").iterdir()) == [
            "rank-00000.json", "rank-00000.safetensors", "rank-00001.json",
            "rank-00001.safetensors"]
        read_checkpoint(folder)  # verifies every file against the manifest
