"""Tar shards as users make and read them: `train --prepare-data --shards`, then training
from them on 2 gloo ranks (the same global sample sequence as 1 process) and through a
kill -9 mid-epoch (the resumed run ends bit-identical with the uninterrupted one)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.helpers import REPO, TESTS, TINY, clean_env
from tests.helpers.hangs import run_or_explain
from tests.helpers.image_hashes import image_hashes
from workload.checkpoint.writer.folder import complete_steps
from workload.config import build_config
from workload.data.shardformat import MANIFEST
from workload.data import build_data

pytestmark = pytest.mark.slow

# The checkout on PYTHONPATH: tests/scripts/shard_sequence.py hashes with tests/helpers.
ENV = {**clean_env(), "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(REPO)}
# Every process followed, fds shown as their paths, no lines about attaching or exits;
# --seccomp-bpf: the kernel stops a process at the traced calls alone, where strace stopped
# it at every call it made (about 3 CPU-s more for each `import torch` here).
STRACE = ["strace", "-f", "-qq", "-y", "--seccomp-bpf"]
# 120 training images of 8 px: 15 steps of 8 an epoch in one process.
TRAIN = [*TINY, "--dataset", "shards", "--image-size", "8", "--epochs", "2", "--seed", "4",
         "--workers", "1", "--precision", "fp32"]


def write_shards_cli(source: Path, dest: Path, size: int = 25) -> str:
    done = subprocess.run([sys.executable, "-m", "workload.train", "--dataset", "imagefolder",
                           "--data-dir", str(source), "--prepare-data", "--shards", str(dest),
                           "--shard-size", str(size)], capture_output=True, text=True, env=ENV,
                          timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout + done.stderr


@pytest.fixture(scope="module")
def shards(shard_source, tmp_path_factory) -> Path:
    """The session's image folder, packed by the command users type."""
    dest = tmp_path_factory.mktemp("cli") / "shards"
    log = write_shards_cli(shard_source, dest)
    assert "images/s, about" in log and "in 10 shards" in log
    return dest


def test_a_rewrite_keeps_the_users_dali_indexes_and_says_what_it_removed(shards, shard_source,
                                                                         tmp_path):
    """D5 (issue 59): `wds2idx train-000000.tar train-000000.idx` (the docs' example) beside
    the shards was deleted without a word by a rewrite with another --shard-size."""
    dest = tmp_path / "shards"
    shutil.copytree(shards, dest)
    indexes = [dest / shard.with_suffix(".idx").name for shard in sorted(dest.glob("*.tar"))]
    for index in indexes:
        index.write_text(f"v1.2 {index.name}: DALI's index\n")
    log = write_shards_cli(shard_source, dest, 50)
    assert all(i.read_text() == f"v1.2 {i.name}: DALI's index\n" for i in indexes)
    assert ("removed the 4 shards of an earlier write that its index listed "
            "(train-000003.tar, train-000004.tar, val-000003.tar, ...)") in log


def in_one_process(shards: Path, batch_size: int, epoch: int) -> list[str]:
    cfg = build_config(dict(dataset="shards", data_dir=str(shards), image_size=8, seed=4,
                            batch_size=batch_size, workers=0), "cpu")
    data = build_data(cfg, torch.device("cpu"))
    return [h for images, _ in data.train.batches(epoch) for h in image_hashes(images)]


def test_two_ranks_read_the_global_sequence_of_one_process(shards, tmp_path):
    record, trace = tmp_path / "seen", tmp_path / "trace"
    done = run_or_explain([*STRACE, "-e", "trace=openat,getdents64,clone,clone3,fork,vfork",
                           "-o", str(trace), sys.executable, "-m", "torch.distributed.run",
                           "--standalone", "--nproc-per-node=2",
                           str(TESTS / "scripts" / "shard_sequence.py"),
                           str(record), *TRAIN, "--data-dir", str(shards), "--batch-size", "8",
                           "--output-dir", str(tmp_path / "run")], env=ENV, timeout=300)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    # Start-up reads the manifest, never a listing; each rank reads its own stretch of
    # the shards. Evaluation's is the same every epoch: 5 shards of 25 in 4 lanes of 30,
    # 2 lanes and 3 shards a rank (training's moves with each epoch's shard order, and
    # two epochs may cover all 5: the unit tests hold it per epoch).
    opened = shards_opened_by_rank(trace, shards)
    assert len(opened) == 2 and not touched(trace, shards)[1]
    val = [{name for name in names if name.startswith("val")} for names in opened]
    assert [len(names) for names in val] == [3, 3] and len(val[0] | val[1]) == 5
    ranks = [json.loads(Path(f"{record}.rank{r}.json").read_text()) for r in (0, 1)]
    for epoch in (0, 1):
        dealt = [h for pair in zip(ranks[0][str(epoch)], ranks[1][str(epoch)]) for h in pair]
        assert len(dealt) == 112  # 7 steps of 2 x 8
        assert dealt == in_one_process(shards, 16, epoch)[:112]
    assert ranks[0]["0"] != ranks[0]["1"]


def traced(trace: Path, args: list[str]) -> subprocess.CompletedProcess:
    """`train` with every file it opens and every folder it lists (all its processes)
    written to `trace`, fds shown as their paths."""
    return run_or_explain([*STRACE, "-e", "trace=openat,getdents64", "-o", str(trace),
                           sys.executable, "-m", "workload.train", *args], env=ENV, timeout=300)


def touched(trace: Path, folder: Path) -> tuple[set[str], bool]:
    """The files of `folder` the traced processes opened, and whether one listed it."""
    inside = f"{folder}/"
    lines = trace.read_text().splitlines()
    opened = {line.split(inside)[1].split('"')[0] for line in lines
              if "openat(" in line and inside in line}
    listed = any("getdents64(" in line and f"<{folder}>" in line for line in lines)
    return opened, listed


def shards_opened_by_rank(trace: Path, folder: Path) -> list[set[str]]:
    """Per rank (a process that opened the manifest), the shards it and the processes
    and threads it started opened."""
    parent, opens = {}, []
    for line in trace.read_text().splitlines():
        pid, _, call = line.partition(" ")
        started = re.search(r"(clone3?|v?fork)\(.*= (\d+)$|<\.\.\. (clone3?|v?fork) "
                            r"resumed>.*= (\d+)$", call)
        if started:
            parent[int(started.group(2) or started.group(4))] = int(pid)
        if "openat(" in call and f"{folder}/" in call:
            opens.append((int(pid), call.split(f"{folder}/")[1].split('"')[0]))
    ranks = {pid for pid, name in opens if name == MANIFEST}
    found: dict[int, set[str]] = {rank: set() for rank in ranks}
    for pid, name in opens:
        while pid not in ranks:
            pid = parent[pid]
        if name.endswith(".tar"):
            found[pid].add(name)
    return list(found.values())


def newest_step(root: Path) -> int:
    steps = complete_steps(root)
    return steps[-1][0] if steps else 0


def train(shards: Path, out: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "workload.train", *TRAIN, "--data-dir",
                             str(shards), "--batch-size", "8", "--checkpoint-every", "1",
                             "--output-dir", str(out)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=ENV)


def finish(proc: subprocess.Popen, out: Path) -> dict:
    log = proc.communicate(timeout=600)[0]
    assert proc.returncode == 0, log[-4000:]
    return json.loads((out / "summary.json").read_text())


def test_kill_minus_9_mid_epoch_then_resume_ends_bit_identical(shards, tmp_path):
    reference = train(shards, tmp_path / "reference")
    killed = train(shards, tmp_path / "killed")
    root = tmp_path / "killed" / "checkpoints"
    while newest_step(root) < 20 and killed.poll() is None:  # epoch 2, its 5th step
        time.sleep(0.01)
    assert killed.poll() is None, "the run ended before the kill"
    killed.kill()
    killed.wait()
    assert newest_step(root) < 30
    resumed = finish(train(shards, tmp_path / "killed"), tmp_path / "killed")
    expected = finish(reference, tmp_path / "reference")
    assert resumed["model_sha256"] == expected["model_sha256"]




def test_a_shards_run_with_stage_to_reads_the_staged_copy_and_the_next_job_reuses_it(
        shards, shard_source, tmp_path):
    local = tmp_path / "local"
    common = [*TRAIN, "--batch-size", "8", "--epochs", "1", "--stage-to", str(local),
              "--output-dir", str(tmp_path / "run")]
    args = [*common, "--data-dir", str(shards)]
    first = subprocess.run([sys.executable, "-m", "workload.train", *args, "--prepare-data"],
                           capture_output=True, text=True, env=ENV, timeout=600)
    assert first.returncode == 0, first.stderr[-3000:]
    assert f"staged {shards} to {local}/shards-" in first.stdout + first.stderr
    [staging] = [p for p in local.iterdir() if p.is_dir()]
    trace = tmp_path / "trace"
    second = traced(trace, args)  # the next job on the node: it trains from the staging
    assert second.returncode == 0, second.stderr[-3000:]
    assert f"reusing the staging of {shards} in {staging}" in second.stdout + second.stderr
    opened, listed = touched(trace, shards)
    assert opened == {"manifest.json"} and not listed  # the source: its manifest alone
    opened, _ = touched(trace, staging)
    assert "manifest.json" in opened and any(name.endswith(".tar") for name in opened)
    # An image folder is not shards: refused before anything is copied.
    other = subprocess.run([sys.executable, "-m", "workload.train", *common,
                            "--data-dir", str(shard_source)],
                           capture_output=True, text=True, env=ENV, timeout=600)
    assert other.returncode == 2, other.stderr[-3000:]
    assert f"--data-dir {shard_source} has no readable manifest.json" in other.stderr
    assert [p for p in local.iterdir() if p.is_dir()] == [staging]
