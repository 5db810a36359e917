"""`train --checkpoint-local DIR` (a node-local tier) and `--no-checkpoint-async`, as
subprocesses: a bad DIR is one line before any work; a synchronous run saves with no
writer process and copies every checkpoint into the run folder; a job that ended before
its last copy resumes from the newer local checkpoint, copied and verified first, with
one line; an asynchronous run (the default) copies in its writer. A full disk met by the
background writer stops `train` with the synchronous save's one line and status 2."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import CHECKPOINT_ARGS, tmpfs
from workload.checkpoint.writer.folder import complete_steps, latest_step, replace_latest
from workload.checkpoint.local import local_root
from workload.checkpoint.writer.store import MANIFEST, verify


def train(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "workload.train", *args],
                          capture_output=True, text=True, timeout=600)


def manifests(root: Path) -> dict[int, str]:
    return {step: (path / MANIFEST).read_text() for step, path in complete_steps(root)}


@pytest.mark.parametrize("bad", ["a-file", "run/inside", "/proc/hpc-train-no-such"])
def test_a_bad_local_folder_is_one_line_before_any_work(tmp_path, bad):
    (tmp_path / "a-file").write_text("x")
    value = bad if bad.startswith("/") else str(tmp_path / bad)
    done = train("--checkpoint-local", value, "--output-dir", str(tmp_path / "run"))
    assert done.returncode == 2 and done.stdout == "", done.stderr
    [line] = done.stderr.splitlines()
    assert line.startswith(f"train: error: --checkpoint-local {value}") and "$SLURM_TMPDIR" \
        in line, line
    assert not (tmp_path / "run" / "checkpoints").exists()


@pytest.mark.slow
def test_local_checkpoints_are_copied_and_a_newer_local_one_is_resumed(tmp_path):
    out, local = tmp_path / "run", tmp_path / "node-local"
    run_root, node = out / "checkpoints", local_root(str(local), out)
    first = train(*CHECKPOINT_ARGS, "--max-steps", "6", "--no-checkpoint-async",
                  "--checkpoint-local", str(local), "--output-dir", str(out))
    text = first.stdout + first.stderr
    assert first.returncode == 0, text[-3000:]
    assert "staging buffer" not in text and "handed to the writer" not in text, text
    assert "checkpoint (periodic) at step 4:" in text and "saved in" in text
    # The same checkpoints, byte for byte, in both places.
    assert manifests(run_root) == manifests(node) and 6 in manifests(node)
    # As if the job had ended while step 6 was being copied: the run folder's newest is 4.
    (run_root / "step-000000006").rename(run_root / ".tmp-step-000000006")
    replace_latest(run_root, "step-000000004")
    second = train(*CHECKPOINT_ARGS, "--max-steps", "8", "--checkpoint-local", str(local),
                   "--output-dir", str(out))
    text = second.stdout + second.stderr
    assert second.returncode == 0, text[-3000:]
    assert "is newer than the run folder's newest checkpoint (step 4)" in text, text[-3000:]
    assert f"resumed from {run_root / 'step-000000006'}: step 6," in text, text[-3000:]
    assert "handed to the writer" in text  # asynchronous: the writer copies too
    assert latest_step(run_root) == 8 and manifests(run_root)[8] == manifests(node)[8]


@pytest.mark.root
@pytest.mark.slow
def test_a_full_disk_in_the_writer_stops_train_in_one_line(tmp_path):
    with tmpfs(tmp_path / "tmpfs", "size=320k") as small:  # one checkpoint and a bit
        out = small / "run"
        done = train(*CHECKPOINT_ARGS, "--output-dir", str(out))
        text = done.stdout + done.stderr
        assert done.returncode == 2, text[-3000:]
        [line] = [line for line in done.stderr.splitlines() if "error" in line]
        assert line.startswith("train: error: no space left to save a checkpoint in "
                               f"{out / 'checkpoints'}"), text[-3000:]
        assert "handed to the writer" in text and "done:" not in text
        left = complete_steps(out / "checkpoints")
        assert left and latest_step(out / "checkpoints") == left[-1][0]
        assert verify(left[-1][1]) and not list((out / "checkpoints").glob(".tmp-*"))


@pytest.mark.slow
def test_the_run_folder_is_the_truth_over_the_local_tier(tmp_path):
    """A rollback (--resume PATH) killed before its first save stands: the next job goes
    on from the rolled-back step, not from the local tier's later copies. And after `rm
    -rf` of the run folder, the same command starts from step 0, with one line, where it
    used to resume the deleted run from the local tier."""
    out, local = tmp_path / "run", tmp_path / "node-local"
    run_root = out / "checkpoints"
    again = [*CHECKPOINT_ARGS, "--checkpoint-local", str(local), "--output-dir", str(out)]
    first = train(*again, "--max-steps", "6")
    assert first.returncode == 0, (first.stdout + first.stderr)[-3000:]
    # The rollback to step 2, killed as soon as it has resumed: its first save would come
    # at the epoch's end (step 8), long after.
    rollback = subprocess.Popen([sys.executable, "-m", "workload.train", *again,
                                 "--resume", str(run_root / "step-000000002"),
                                 "--checkpoint-every", "1000"],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for line in rollback.stdout:
        if "resumed from" in line:
            rollback.kill()
            break
    rollback.communicate(timeout=60)
    assert latest_step(run_root) == 2
    second = train(*again, "--max-steps", "4")
    text = second.stdout + second.stderr
    assert second.returncode == 0, text[-3000:]
    assert "the job ended before its copy did" not in text, text[-3000:]
    assert f"resumed from {run_root / 'step-000000002'}: step 2," in text, text[-3000:]
    shutil.rmtree(out)
    third = train(*again, "--max-steps", "2")
    text = third.stdout + third.stderr
    assert third.returncode == 0, text[-3000:]
    assert "resumed from" not in text and "starting from step 0" in text, text[-3000:]
    [line] = [line for line in text.splitlines() if "gone or was replaced" in line]
    assert f"{out} is gone or was replaced; not resumed" in line, line
