"""Checkpoints that pass their manifest but must still be refused, names that would leave
the folder, symbolic links, pruning of folders moved aside, and a save on a full disk.
No training here: the files are written by the store itself."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest
import torch
from torch import nn

from tests.helpers import tmpfs
from workload.checkpoint.content import check_fits
from workload.checkpoint.writer.folder import complete_steps, prune, prune_aside, step_name
from workload.checkpoint.formats import read_part, read_tensors, safetensors_bytes, write_part
from workload.checkpoint.writer.diskfull import DiskFull
from workload.checkpoint.inprocess import save_checkpoint
from workload.checkpoint.snapshot import local_states, read_checkpoint, restore
from workload.checkpoint.writer.store import MANIFEST, CorruptCheckpoint, Snapshot, verify
from workload.files import sha256_file
from workload.training.trainer import TrainState


def live_state(width: int = 3) -> TrainState:
    model = nn.Linear(width, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    return TrainState(model, optimizer, schedule, torch.amp.GradScaler("cpu"))


def snapshot_of(state: TrainState, step: int) -> Snapshot:
    schedule = dict(state.schedule.state_dict(), last_epoch=step, _step_count=step + 1)
    trainer = dict(format=1, schedule=schedule,
                   scaler=state.scaler.state_dict(), epoch=0, batch=step, step=step,
                   accuracies=[], world_size=1)
    return Snapshot(state.model.state_dict(), state.optimizer.state_dict(), trainer,
                    [local_states()], {"seed": 1})


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
    check_fits(read_checkpoint(path), state, path)


def part(data) -> str:
    return json.dumps({"format": 2, "data": data})


@pytest.mark.parametrize("damage, words", [
    (lambda p: (p / "config.json").write_text("{not json"), "config.json is not readable JSON"),
    (lambda p: (p / "config.json").write_text("[1, 2]"), "config.json is not a JSON object"),
    (lambda p: (p / "trainer.json").write_text(part({"step": 3})), "trainer.json"),
    (lambda p: (p / "trainer.json").write_text(part([1, 2])), "trainer.json"),
    (lambda p: (p / "trainer.json").write_text('{"format": 2, "data": NaN}'), "trainer.json"),
    (lambda p: (p / "trainer.json").write_text(part({"__tensor__": "x"})), "trainer.json"),
    (lambda p: (p / "model.safetensors").write_bytes(safetensors_bytes({})), "model.safetensors"),
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
        read_checkpoint(path)  # ...the content is not


def test_another_model_s_weights_do_not_fit(tmp_path):
    path = save(tmp_path, 4, live_state(width=5))
    with pytest.raises(CorruptCheckpoint, match="another model.*of another shape"):
        check_fits(read_checkpoint(path), live_state(width=3), path)


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


@pytest.mark.root
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

    from workload.checkpoint.resuming import prepare
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


# --- content behind a matching manifest: every value checked before it is restored ---------

def trained_state() -> TrainState:
    """A live state after one step: momentum buffers and a schedule that has moved."""
    state = live_state()
    state.model(torch.ones(4, 3)).sum().backward()
    state.optimizer.step()
    state.schedule.step()
    return state


def edit_part(name: str, change):
    """A damage that rewrites one part (trainer, rng, optimizer) as a forger would."""
    def damage(path: Path) -> None:
        tree = read_part(path, name)
        change(tree)
        for old in path.glob(f"{name}.*"):  # a save only makes new files (create_new)
            old.unlink()
        write_part(path, name, tree)
    return damage


def trainer(**values):
    return edit_part("trainer", lambda tree: tree.update(values))


def first_rng(change):
    return edit_part("rng", lambda tree: change(tree[0]))


def optimizer(change):
    return edit_part("optimizer", change)


def nested_json(name: str, depth: int):
    def damage(path: Path) -> None:
        (path / name).write_text('{"format": 2, "data": ' + "[" * depth + "]" * depth + "}")
    return damage


def int8_weights(path: Path) -> None:
    weights = read_tensors(path / "model.safetensors")
    (path / "model.safetensors").write_bytes(safetensors_bytes(
        {k: v.to(torch.int8) for k, v in weights.items()}))


DAMAGED_CONTENT = {  # (damage, words in the one line that names it)
    "step -5": (trainer(step=-5), "trainer.json.*step"),
    "step 10^30": (trainer(step=10**30), "trainer.json.*step"),
    "step a bool": (trainer(step=True), "trainer.json.*step"),
    "epoch 10^6": (trainer(epoch=10**6), "trainer.json.*epoch"),
    "epoch -3": (trainer(epoch=-3), "trainer.json.*epoch"),
    "batch 10^6": (trainer(batch=10**6), "trainer.json.*batch"),
    "world size 0": (trainer(world_size=0), "trainer.json.*world_size"),
    "world size 2, one rng": (trainer(world_size=2), "trainer.json.*world_size"),
    "schedule {}": (trainer(schedule={}), "trainer.json.*schedule"),
    "schedule at another step": (
        edit_part("trainer", lambda t: t["schedule"].update(last_epoch=7)), "schedule"),
    "schedule lr a text": (
        edit_part("trainer", lambda t: t["schedule"].update(base_lrs=["fast"])), "schedule"),
    "accuracies text": (trainer(accuracies=["high"]), "trainer.json.*accuracies"),
    "accuracies NaN": (trainer(accuracies=[math.nan]), "trainer.json.*accuracies"),
    "accuracies 7": (trainer(accuracies=[7]), "trainer.json.*accuracies"),
    "scaler state": (trainer(scaler={"scale": "big"}), "scaler"),
    "scaler scale 0": (trainer(scaler={"scale": 0.0, "growth_factor": 2.0, "backoff_factor": 0.5,
                                       "growth_interval": 2000, "_growth_tracker": 0}),
                       "scale is 0"),
    "scaler scale text": (trainer(scaler={"scale": "big", "growth_factor": 2.0,
                                          "backoff_factor": 0.5, "growth_interval": 2000,
                                          "_growth_tracker": 0}), "scaler.scale is a str"),
    "rng torch float": (first_rng(lambda r: r.update(torch=torch.zeros(5056))), "rng.json"),
    "rng torch short": (first_rng(lambda r: r.update(torch=r["torch"][:100])), "rng.json"),
    "rng numpy keys short": (first_rng(lambda r: r["numpy"].update(keys=r["numpy"]["keys"][:9])),
                             "rng.json"),
    "rng numpy keys negative": (
        first_rng(lambda r: r["numpy"].update(keys=-r["numpy"]["keys"] - 1)), "rng.json"),
    "rng numpy pos": (first_rng(lambda r: r["numpy"].update(pos=10**6)), "rng.json"),
    "rng python internal": (first_rng(lambda r: r["python"].update(internal=[1, 2])), "rng.json"),
    "rng python text": (first_rng(lambda r: r["python"].update(version="three")), "rng.json"),
    "rng cuda not tensors": (first_rng(lambda r: r.update(cuda=["x"])), "rng.json"),
    "optimizer lr text": (optimizer(lambda o: o["param_groups"][0].update(lr="fast")),
                          "optimizer"),
    "optimizer lr missing": (optimizer(lambda o: o["param_groups"][0].pop("lr")), "optimizer"),
    "optimizer lr negative": (optimizer(lambda o: o["param_groups"][0].update(lr=-0.1)),
                              "optimizer.*lr is -0.1"),
    "optimizer lr infinite": (
        optimizer(lambda o: o["param_groups"][0].update(lr=math.inf)), "optimizer.*lr"),
    "optimizer params renumbered": (
        optimizer(lambda o: o["param_groups"][0].update(params=[0, 5])), "optimizer"),
    "momentum of another shape": (
        optimizer(lambda o: o["state"][0].update(momentum_buffer=torch.zeros(7))), "optimizer"),
    "momentum int8": (optimizer(lambda o: o["state"][0].update(
        momentum_buffer=o["state"][0]["momentum_buffer"].to(torch.int8))), "optimizer"),
    "momentum a number": (optimizer(lambda o: o["state"][0].update(momentum_buffer=3)),
                          "optimizer"),
    "optimizer state a list": (optimizer(lambda o: o["state"].update({0: [1]})), "optimizer"),
    "weights int8": (int8_weights, "model.safetensors"),
    "trainer nested 600 deep": (nested_json("trainer.json", 600), "trainer.json"),
    "rng nested 5000 deep": (nested_json("rng.json", 5000), "rng.json"),
    "config nested 5000 deep": (
        lambda p: (p / "config.json").write_text("[" * 5000 + "]" * 5000), "config.json"),
}


@pytest.mark.parametrize("case", DAMAGED_CONTENT)
def test_damaged_content_behind_a_matching_manifest_is_corrupt(tmp_path, case):
    damage, words = DAMAGED_CONTENT[case]
    state = trained_state()
    path = save(tmp_path, 1, state)
    damage(path)
    remanifest(path)
    verify(path)  # the manifest is satisfied...
    with pytest.raises(CorruptCheckpoint, match=words) as error:
        check_fits(read_checkpoint(path), trained_state(), path)  # ...the content not
    assert "\n" not in str(error.value) and len(str(error.value)) < 500


def test_a_good_checkpoint_restores_after_every_check(tmp_path):
    state = trained_state()
    path = save(tmp_path, 1, state)
    snapshot = read_checkpoint(path)
    fresh = live_state()
    check_fits(snapshot, fresh, path)
    restore(snapshot, fresh, 0, 1)
    assert fresh.step == 1 and fresh.schedule.last_epoch == 1
    assert torch.equal(fresh.optimizer.state_dict()["state"][0]["momentum_buffer"],
                       state.optimizer.state_dict()["state"][0]["momentum_buffer"])


def manifest_with(text: str | bytes):
    """The manifest with `text` as one more key's value (JSON text, or bytes)."""
    def damage(path: Path) -> None:
        manifest = (path / MANIFEST).read_bytes()
        added = text if isinstance(text, bytes) else text.encode()
        (path / MANIFEST).write_bytes(b'{"x": ' + added + b", " + manifest.lstrip()[1:])
    return damage


def manifest_naming(name: str):
    """The manifest with one more file entry, named `name` (JSON text, escapes allowed)."""
    def damage(path: Path) -> None:
        manifest = json.loads((path / MANIFEST).read_text())
        text = json.dumps(manifest)
        entry = '{"bytes": 1, "sha256": "00"}'
        (path / MANIFEST).write_text(text.replace('"files": {', f'"files": {{"{name}": {entry}, '))
    return damage


@pytest.mark.parametrize("damage", [
    manifest_naming("a\\u0000b"), manifest_naming("x" * 5000), manifest_naming("\\ud800"),
    manifest_naming("shards/" + "d/" * 300 + "f"),
    manifest_with("[" * 100_000 + "]" * 100_000),
    manifest_with('{"a": ' * 600 + "1" + "}" * 600),
    manifest_with("1e400"),
    manifest_with(b'"\xff"'),
], ids=["NUL", "5000 characters", "lone surrogate", "300 folders deep", "100000 deep",
        "600 deep", "1e400", "not UTF-8"])
def test_an_edited_manifest_is_corrupt_in_one_line(tmp_path, damage):
    path = save(tmp_path, 4)
    damage(path)
    with pytest.raises(CorruptCheckpoint, match="MANIFEST.json") as error:
        verify(path)
    message = str(error.value)
    assert "\n" not in message and len(message) < 500 and message.isascii()


def test_a_shard_offset_that_is_not_a_number_of_rows_is_corrupt(tmp_path):
    from workload.checkpoint.snapshot import read_shards

    folder = tmp_path / "step-000000004" / "shards"
    folder.mkdir(parents=True)
    (folder / "rank-00000.safetensors").write_bytes(safetensors_bytes({"w": torch.ones(2, 3)}))
    (folder / "rank-00000.json").write_text(
        '{"format": 2, "rank": 0, "world_size": 1, "state": {"model": {"w": '
        '{"__shard__": "w", "shape": [2, 3], "offset": 1e400, "length": 2}}, '
        '"optimizer": {"state": {}, "param_groups": []}}}')
    listed = {f"shards/rank-00000{suffix}": {} for suffix in (".json", ".safetensors")}
    with pytest.raises(CorruptCheckpoint, match="rank-00000.json"):
        read_shards(folder, 1, listed)


def test_resume_auto_checks_that_the_checkpoint_fits_once_per_rank(tmp_path, monkeypatch):
    """--resume auto: rank 0 checks that the newest checkpoint fits the model while it
    chooses it; the resume then checks it no second time (the check walks every tensor)."""
    from workload.checkpoint import resuming
    from workload.checkpoint.snapshot import run_settings
    from workload.config import TrainConfig
    from workload.distributed import DistInfo
    cfg, state = TrainConfig(), trained_state()
    snapshot = snapshot_of(state, 1)
    snapshot.config.clear()
    snapshot.config.update(run_settings(cfg, 2))
    save_checkpoint(tmp_path / "checkpoints", snapshot, 3, True)
    checks = []
    monkeypatch.setattr(resuming, "check_fits",
                        lambda *args, **kwargs: checks.append(check_fits(*args, **kwargs)))
    fresh = live_state()
    resuming.resume(cfg, DistInfo.alone(torch.device("cpu")), fresh, tmp_path, 2)
    assert fresh.step == 1 and len(checks) == 1


class Counted:
    """A stateful part, as a measurement adds one (TrainState.parts)."""

    def __init__(self, total: float = 0.0):
        self.total, self.given = total, "not called"

    def state_dict(self) -> dict:
        return {"total": self.total}

    def load_state_dict(self, saved) -> None:
        self.given = saved


def test_a_stateful_part_round_trips_through_a_checkpoint(tmp_path):
    """What a checkpoint carries besides model and optimizer is a part that saves and
    restores itself: its state under its name in trainer.json, given back on resume; a
    checkpoint without it gives None (the part says what that means)."""
    from workload.checkpoint.snapshot import take_snapshot
    state = trained_state()
    state.parts["counted"] = Counted(12.5)
    path = save_checkpoint(tmp_path, take_snapshot(state, {"seed": 1}, 1, False), 3, True)
    assert read_part(path, "trainer")["counted"] == {"total": 12.5}
    fresh, fresh_part, other = live_state(), Counted(), Counted()
    fresh.parts.update(counted=fresh_part, other=other)
    restore(read_checkpoint(path), fresh, 0, 1)
    assert fresh_part.given == {"total": 12.5} and other.given is None
