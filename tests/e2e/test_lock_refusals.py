"""Run folders the lock cannot work in: `train` stops before anything starts with one line
that says why and what to do, exit status 2 (docs/checkpoints.md, "One writer per run
folder")."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.helpers import CHECKPOINT_ARGS, clean_env, vfat

ARGS = [*CHECKPOINT_ARGS, "--max-steps", "1"]


def train(out) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "workload.train", *ARGS, "--output-dir",
                           str(out)], capture_output=True, text=True, env=clean_env(),
                          timeout=300)


@pytest.mark.root
def test_an_output_dir_without_hard_links_is_named_with_the_fix(tmp_path):
    with vfat(tmp_path / "fat", tmp_path / "fat.img") as fat:
        done = train(fat / "run")
        lock_files = [p.name for p in (fat / "run").iterdir() if "lock" in p.name]
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "without hard links" in lines[0] and "--output-dir" in lines[0], lines[0]
    assert "keeps changing hands" not in lines[0]
    assert lock_files == [], "no lock or draft left behind"


def test_a_folder_named_train_lock_is_one_line(tmp_path):
    (tmp_path / "run" / "train.lock").mkdir(parents=True)
    done = train(tmp_path / "run")
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "train.lock is a folder, not the lock file" in lines[0], done.stderr
    assert (tmp_path / "run" / "train.lock").is_dir()
