"""Which run and which point of it `train` continues: another run's checkpoints refused, a
rollback followed, a step limit continued exactly, --overwrite removing only train's files.
Each test runs the installed `train` console script as a user does."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import CHECKPOINT_ARGS as ARGS
from tests.helpers import TINY, clean_env, read_jsonl, write_image_folder

pytestmark = pytest.mark.slow  # every test here trains

TRAIN = str(Path(sys.executable).with_name("train"))
# 8 steps an epoch (32 images, batch 4: quick steps), enough epochs for 60 steps.
LONG = [*ARGS, "--epochs", "8", "--synthetic-size", "32", "--batch-size", "4"]


def train(args: list[str], out: Path) -> subprocess.CompletedProcess:
    """`train ARGS --output-dir OUT` as a separate process."""
    return subprocess.run([TRAIN, *args, "--output-dir", str(out)], capture_output=True,
                          text=True, env=clean_env(), timeout=600)


def trained(args: list[str], out: Path) -> tuple[dict, str]:
    """A run that must succeed: its summary and its output."""
    done = train(args, out)
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads((out / "summary.json").read_text()), done.stdout + done.stderr


def error_line(done: subprocess.CompletedProcess) -> str:
    """The one `train: error:` line of a refused run (exit status 2)."""
    assert done.returncode == 2, done.stdout + done.stderr
    lines = [line for line in done.stderr.splitlines() if "error:" in line]
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    return lines[0]


def listing(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def saves(log: str) -> list[int]:
    """The step of every checkpoint the log reports, in order."""
    return [int(step) for step in re.findall(r"checkpoint \([^)]*\) at step (\d+)", log)]


# --- 3: another run's checkpoints ------------------------------------------------------------

def test_data_of_another_class_count_is_refused_and_nothing_moves(tmp_path):
    images = [*ARGS[:ARGS.index("--dataset")], "--dataset", "imagefolder", "--image-size",
              "16", "--batch-size", "8", "--epochs", "1", "--checkpoint-every", "2"]
    two = write_image_folder(tmp_path / "two", classes=2, per_class=8, size=16)
    three = write_image_folder(tmp_path / "three", classes=3, per_class=8, size=16)
    out = tmp_path / "run"
    trained([*images, "--data-dir", str(two)], out)
    before = run_files(out)
    line = error_line(train([*images, "--data-dir", str(three)], out))
    assert "2 classes" in line and "3" in line and "another run" in line
    assert "--output-dir" in line and "--resume never --overwrite" in line
    assert run_files(out) == before, "nothing moved"
    # The same data again still resumes: the class count is what differed.
    summary, log = trained([*images, "--data-dir", str(two), "--epochs", "2"], out)
    assert "resumed from" in log and summary["epochs_run"] == 2


# --- 5: --overwrite ----------------------------------------------------------------------

def test_resume_never_and_overwrite_keep_the_files_train_did_not_write(tmp_path):
    """--resume never starts a run beside files in checkpoints/ that are not checkpoints;
    on that run's checkpoints it is refused, and --overwrite then removes only what train
    wrote. One first run serves both (a separate one cost a `train`, about 7 CPU-s)."""
    out = tmp_path / "run"
    root = out / "checkpoints"
    root.mkdir(parents=True)
    (root / "notes.txt").write_text("mine")
    summary, _ = trained([*ARGS, "--epochs", "1", "--resume", "never"], out)
    assert summary["steps_run"] == 8
    assert (root / "notes.txt").read_text() == "mine"
    (root / "other-tool").mkdir()
    (root / "other-tool" / "state.bin").write_bytes(b"x")
    refused = error_line(train([*ARGS, "--epochs", "1", "--resume", "never"], out))
    assert "--overwrite" in refused and "step-" in refused and "other files" in refused
    summary, log = trained([*ARGS, "--epochs", "1", "--resume", "never", "--overwrite"], out)
    assert (root / "notes.txt").read_text() == "mine"
    assert (root / "other-tool" / "state.bin").read_bytes() == b"x"
    assert len(read_jsonl(out / "metrics.jsonl")) == 1 and summary["steps_run"] == 8


# --- 6: a rollback ---------------------------------------------------------------------

def test_auto_follows_a_rollback_and_keeps_the_abandoned_steps(tmp_path):
    out = tmp_path / "run"
    root = out / "checkpoints"
    trained([*ARGS, "--keep-checkpoints", "8"], out)  # steps 2, 4, ..., 16
    abandoned = {p.name: sorted(q.name for q in p.iterdir())
                 for p in root.glob("step-*") if int(p.name[5:]) > 6}
    _, log = trained([*ARGS, "--resume", str(root / "step-000000006"), "--max-steps", "9",
                      "--keep-checkpoints", "8"], out)
    assert "step-000000016" in log and "abandoned" in log
    assert (root / "latest").read_text().strip() == "step-000000009"
    kept = {p.name.split(".")[0]: sorted(q.name for q in p.iterdir())
            for p in root.glob("step-*.abandoned-*")}
    assert kept == abandoned, "the abandoned timeline is kept, whole"
    _, log = trained([*ARGS, "--max-steps", "12", "--keep-checkpoints", "8"], out)
    assert "resumed from" in log and "step-000000009" in log
    assert "resumed from " + str(root / "step-000000016") not in log
    assert sorted(kept) == sorted(p.name.split(".")[0] for p in root.glob("step-*.abandoned-*"))


# --- 7, 8: the step limit ------------------------------------------------------------------

def test_a_step_limit_then_a_larger_one_ends_like_one_run(tmp_path):
    straight, _ = trained([*LONG, "--checkpoint-every", "0", "--max-steps", "60"],
                          tmp_path / "straight")
    out = tmp_path / "stopped"
    first, log = trained([*LONG, "--checkpoint-every", "0", "--max-steps", "20"], out)
    assert first["steps_run"] == 20 and saves(log)[-1] == 20
    _, log = trained([*LONG, "--checkpoint-every", "0", "--max-steps", "60"], out)
    assert "step 20, epoch 3, batch 4 of the epoch" in log
    resumed = json.loads((out / "summary.json").read_text())
    assert resumed["steps_run"] == 60
    assert resumed["model_sha256"] == straight["model_sha256"]
    assert [r["epoch"] for r in read_jsonl(out / "metrics.jsonl")] == list(range(1, 9))


def test_an_image_folder_read_by_workers_stopped_mid_epoch_continues_like_one_run(tmp_path):
    # Each sample's augmentation is seeded by its place in the epoch, not drawn from the
    # DataLoader worker's generator, which a resumed run starts afresh.
    images = write_image_folder(tmp_path / "images", per_class=12, size=16)  # 6 steps an epoch
    folder = [*TINY, "--dataset", "imagefolder", "--data-dir", str(images), "--image-size", "16",
              "--batch-size", "4", "--epochs", "2", "--seed", "5", "--workers", "1",
              "--checkpoint-every", "0"]
    straight, _ = trained(folder, tmp_path / "straight")
    out = tmp_path / "stopped"
    trained([*folder, "--max-steps", "8"], out)
    resumed, log = trained(folder, out)
    assert "step 8, epoch 2, batch 2 of the epoch" in log
    assert resumed["steps_run"] == 12
    assert resumed["model_sha256"] == straight["model_sha256"]


def test_a_step_limit_on_a_checkpoint_step_saves_it_once(tmp_path):
    out = tmp_path / "run"
    _, log = trained([*LONG, "--checkpoint-every", "2", "--max-steps", "20"], out)
    assert saves(log).count(20) == 1, log
    _, log = trained([*LONG, "--checkpoint-every", "2", "--max-steps", "20"], out)
    assert saves(log) == [], "the same command again: nothing left to train or save"
    assert [r["epoch"] for r in read_jsonl(out / "metrics.jsonl")] == [1, 2, 3]
    _, log = trained([*LONG, "--checkpoint-every", "2", "--max-steps", "24"], out)
    assert saves(log).count(24) == 1, log  # 24 ends epoch 3: periodic and epoch end


def run_files(out):
    """The run's files and their times, but diagnostics/: the refused job's own start-up
    record goes there (where its start stopped), as its heartbeats would."""
    return {p: p.stat().st_mtime_ns for p in out.rglob("*")
            if p.relative_to(out).parts[0] != "diagnostics"}
