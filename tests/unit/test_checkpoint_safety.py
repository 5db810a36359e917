"""Checkpoints that pass their manifest but must still be refused, names that would leave
the folder, symbolic links, pruning of folders moved aside, and a save on a full disk.
No training here: the files are written by the store itself."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from torch import nn

from tests.helpers import tmpfs
from workload.checkpoint import rng
from workload.checkpoint.formats import tensor_bytes
from workload.checkpoint.content import check_fits
from workload.checkpoint.snapshot import read_checkpoint, save_checkpoint
from workload.checkpoint.space import DiskFull
from workload.checkpoint.store import (MANIFEST, CorruptCheckpoint, Snapshot, complete_steps,
                                       prune, prune_aside, step_name, verify)
from workload.files import sha256_file
from workload.training.trainer import TrainState


def live_state(width: int = 3) -> TrainState:
    model = nn.Linear(width, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    return TrainState(model, optimizer, schedule, torch.amp.GradScaler("cpu", enabled=False))


def snapshot_of(state: TrainState, step: int) -> Snapshot:
    trainer = dict(format=1, schedule=state.schedule.state_dict(),
                   scaler=state.scaler.state_dict(), epoch=0, batch=step, step=step,
                   accuracies=[], world_size=1)
    return Snapshot(state.model.state_dict(), state.optimizer.state_dict(), trainer,
                    [rng.local_states()], {"seed": 1})


def save(root: Path, step: int, state: TrainState | None = None, keep: int = 3) -> Path:
    return save_checkpoint(root, snapshot_of(state or live_state(), step), keep, True)


def remanifest(path: Path) -> None:
    """Make the manifest match the files again, as a careful forger would."""
    manifest = json.loads((path / MANIFEST).read_text())
    manifest["files"] = {name: dict(bytes=(path / name).stat().st_size,
                                    sha256=sha256_file(path / name))
                         for name in manifest["files"]}
    (path / MANIFEST).write_text(json.dumps(manifest))


def test_a_good_checkpoint_reads_and_fits(tmp_path):
    state = live_state()
    path = save(tmp_path, 4, state)
    check_fits(read_checkpoint(path, "cpu"), state, path)


def part(data) -> str:
    return json.dumps({"format": 2, "data": data})


@pytest.mark.parametrize("damage, words", [
    (lambda p: (p / "config.json").write_text("{not json"), "config.json is not a JSON object"),
    (lambda p: (p / "config.json").write_text("[1, 2]"), "config.json is not a JSON object"),
    (lambda p: (p / "trainer.json").write_text(part({"step": 3})), "trainer.json"),
    (lambda p: (p / "trainer.json").write_text(part([1, 2])), "trainer.json"),
    (lambda p: (p / "trainer.json").write_text('{"format": 2, "data": NaN}'), "trainer.json"),
    (lambda p: (p / "trainer.json").write_text(part({"__tensor__": "x"})), "trainer.json"),
    (lambda p: (p / "model.safetensors").write_bytes(tensor_bytes({})), "model.safetensors"),
    (lambda p: (p / "model.safetensors").write_bytes(b"\x08" + bytes(7) + b"{}      "),
     "model.safetensors"),
    (lambda p: (p / "rng.json").write_text(part([{}])), "rng.json"),
    (lambda p: (p / "optimizer.json").write_text(part({"state": 1})), "optimizer.json"),
])
def test_bad_content_that_passes_the_manifest_is_corrupt(tmp_path, damage, words):
    path = save(tmp_path, 4)
    damage(path)
    remanifest(path)
    verify(path)  # the manifest is satisfied...
    with pytest.raises(CorruptCheckpoint, match=words):
        read_checkpoint(path, "cpu")  # ...the content is not


def test_another_model_s_weights_do_not_fit(tmp_path):
    path = save(tmp_path, 4, live_state(width=5))
    with pytest.raises(CorruptCheckpoint, match="another model.*of another shape"):
        check_fits(read_checkpoint(path, "cpu"), live_state(width=3), path)


@pytest.mark.parametrize("files", [
    [], {"model.safetensors": "abc"}, {"model.safetensors": {"bytes": "12", "sha256": "x"}},
    "files",
])
def test_a_manifest_with_files_of_the_wrong_types_is_corrupt(tmp_path, files):
    path = save(tmp_path, 4)
    manifest = json.loads((path / MANIFEST).read_text())
    manifest["files"] = files
    (path / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(CorruptCheckpoint, match="MANIFEST.json"):
        verify(path)


def test_names_outside_the_checkpoint_are_refused(tmp_path):
    path = save(tmp_path / "checkpoints", 4)
    outside = tmp_path / "secret.txt"
    outside.write_text("outside the run")
    entry = dict(bytes=outside.stat().st_size, sha256=sha256_file(outside))
    for name in (str(outside), "../../secret.txt"):
        manifest = json.loads((path / MANIFEST).read_text())
        manifest["files"] = {**manifest["files"], name: entry}
        (path / MANIFEST).write_text(json.dumps(manifest))
        with pytest.raises(CorruptCheckpoint, match="not a file inside"):
            verify(path)
    (path / "rng.json").unlink()
    (path / "rng.json").symlink_to(outside)
    remanifest(path)
    with pytest.raises(CorruptCheckpoint, match="outside the checkpoint folder"):
        verify(path)


def test_symlinked_step_folders_are_never_loaded_or_pruned(tmp_path):
    elsewhere = save(tmp_path / "elsewhere", 9)
    root = tmp_path / "checkpoints"
    save(root, 1)
    (root / step_name(9)).symlink_to(elsewhere)
    assert [s for s, _ in complete_steps(root)] == [1]
    for step in (2, 3, 4):
        save(root, step, keep=1)  # pruning after each save: no crash on the link
    assert [s for s, _ in complete_steps(root)] == [4]
    assert (root / step_name(9)).is_symlink() and verify(elsewhere)
    prune(root, keep=1, newest=100)
    assert verify(elsewhere)


def test_folders_moved_aside_keep_the_newest_three_of_each_kind(tmp_path):
    names = [f"step-00000000{i}.{kind}-2026010{i}-120000" for i in range(1, 5)
             for kind in ("corrupt", "incomplete")]
    for name in names:
        (tmp_path / name).mkdir()
    (tmp_path / "step-000000009.corrupt-20250101-000000~1").symlink_to(tmp_path)
    prune_aside(tmp_path)
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == sorted([n for n in names if not n.split("-")[-2].endswith("1")]
                          + ["step-000000009.corrupt-20250101-000000~1"])


@pytest.fixture
def small_tmpfs(tmp_path):
    with tmpfs(tmp_path / "tmpfs", "size=256k") as folder:
        yield folder


def test_a_full_disk_is_one_message_and_leaves_no_partial_folder(small_tmpfs):
    root = small_tmpfs / "checkpoints"
    save(root, 1)
    big = live_state(width=100_000)  # about 800 kB of weights: more than is left
    with pytest.raises(DiskFull) as error:
        save(root, 2, big)
    message = str(error.value)
    assert str(root) in message and "MiB free" in message and "needs about" in message
    assert sorted(os.listdir(root)) == ["latest", step_name(1)]
    assert verify(root / step_name(1))


def test_a_symlinked_checkpoints_folder_is_refused_and_left_alone(tmp_path):
    from types import SimpleNamespace

    from workload.checkpoint.resume import prepare
    from workload.errors import UsageError

    elsewhere = tmp_path / "scratch-checkpoints"
    (elsewhere / "step-000000004").mkdir(parents=True)
    out = tmp_path / "run"
    out.mkdir()
    (out / "checkpoints").symlink_to(elsewhere)
    cfg = SimpleNamespace(checkpoint=SimpleNamespace(resume="auto", overwrite=False))
    with pytest.raises(UsageError, match="symbolic link.*--output-dir"):
        prepare(cfg, out, is_main=True)
    assert (out / "checkpoints").is_symlink() and (elsewhere / "step-000000004").is_dir()
