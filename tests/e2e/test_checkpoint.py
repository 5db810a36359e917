"""Checkpoints on disk: layout, manifest, pruning, and bad files rejected without harm."""

from __future__ import annotations

import json
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.helpers import CHECKPOINT_ARGS as ARGS
from tests.helpers import clean_env, pickles_and_zips, run_train
from workload.checkpoint.formats import read_part, write_part
from workload.checkpoint.writer.store import MANIFEST
from workload.files import sha256_file
from workload.train import main as train_main

pytestmark = pytest.mark.slow  # every test here trains

# 2 epochs of 8 steps; a checkpoint every 2 steps.



@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> tuple[Path, dict]:
    """One finished run with a checkpoint after every step, all kept."""
    out = tmp_path_factory.mktemp("reference") / "run"
    return out, run_train([*ARGS, "--checkpoint-every", "1", "--keep-checkpoints", "100"], out)


def copy_run(reference: tuple[Path, dict], to: Path) -> Path:
    shutil.copytree(reference[0], to)
    return to


def steps_in(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir() if p.name.startswith("step-"))


def test_layout_manifest_and_latest_pointer(reference):
    root = reference[0] / "checkpoints"
    assert steps_in(root) == [f"step-{s:09d}" for s in range(1, 17)]
    assert (root / "latest").read_text().strip() == "step-000000016"
    assert not list(root.glob(".tmp-*")), "no temporary folder is left after a save"
    newest = root / "step-000000016"
    manifest = json.loads((newest / MANIFEST).read_text())
    files = {p.name for p in newest.iterdir()} - {MANIFEST}
    assert set(manifest["files"]) == files == {
        "model.safetensors", "optimizer.json", "optimizer.safetensors", "trainer.json",
        "rng.json", "rng.safetensors", "config.json"}
    for name, entry in manifest["files"].items():
        assert entry["sha256"] == sha256_file(newest / name)
        assert entry["bytes"] == (newest / name).stat().st_size
    trainer = read_part(newest, "trainer")
    assert (trainer["epoch"], trainer["batch"], trainer["step"]) == (2, 0, 16)
    assert len(trainer["accuracies"]) == 2 and trainer["scaler"] is not None
    assert json.loads((newest / "config.json").read_text())["seed"] == 5
    assert {"torch", "numpy", "python"} <= read_part(newest, "rng")[0].keys()
    assert pickles_and_zips(reference[0]) == [], "every file is safetensors, JSON or text"


def test_keeps_the_last_n_checkpoints(tmp_path):
    run_train([*ARGS, "--keep-checkpoints", "3"], tmp_path / "run")
    assert steps_in(tmp_path / "run" / "checkpoints") == [
        "step-000000012", "step-000000014", "step-000000016"]


def test_a_finished_run_started_again_changes_nothing(reference, tmp_path):
    out = copy_run(reference, tmp_path / "again")
    summary = run_train(ARGS, out)
    assert summary["model_sha256"] == reference[1]["model_sha256"]
    lines = (out / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["epoch"] for line in lines] == [1, 2]


@pytest.mark.parametrize("step", [3, 8, 13])
def test_resume_from_a_given_checkpoint_is_exact(step, reference, tmp_path):
    # Mid-epoch (3, 13) and an epoch end (8): continuing gives the same weights, bit for bit.
    path = reference[0] / "checkpoints" / f"step-{step:09d}"
    resumed = run_train([*ARGS, "--resume", str(path)], tmp_path / "resumed")
    assert resumed["model_sha256"] == reference[1]["model_sha256"]
    assert resumed["steps_run"] == 16 and resumed["epochs_run"] == 2


# --- bad files: each rejected with a clear message, the previous checkpoint used ----------

def truncate(folder: Path, payload: Path) -> str:
    model = folder / "model.safetensors"
    model.write_bytes(model.read_bytes()[: model.stat().st_size // 2])
    return "model.safetensors has"


def drop_manifest(folder: Path, payload: Path) -> str:
    (folder / MANIFEST).unlink()
    return f"no {MANIFEST}"


def flip_a_byte(folder: Path, payload: Path) -> str:
    optimizer = folder / "optimizer.safetensors"
    data = bytearray(optimizer.read_bytes())
    data[len(data) // 2] ^= 0x01
    optimizer.write_bytes(bytes(data))
    return "optimizer.safetensors does not match its sha256"


class CreatesAFile:
    """Unpickling this calls open(path, "w"): it would create the file."""

    def __init__(self, path: Path):
        self.path = str(path)

    def __reduce__(self):
        return open, (self.path, "w")


def relist(folder: Path, name: str) -> None:
    manifest = json.loads((folder / MANIFEST).read_text())
    manifest["files"][name] = dict(bytes=(folder / name).stat().st_size,
                                   sha256=sha256_file(folder / name))
    (folder / MANIFEST).write_text(json.dumps(manifest))


def plant_malicious_pickle(folder: Path, payload: Path) -> str:
    # An attacker who can write the file can rewrite the manifest too: the hashes match,
    # and only the formats (JSON, safetensors: no unpickler) stand between it and the payload.
    (folder / "trainer.json").write_bytes(pickle.dumps({"step": 16, "x": CreatesAFile(payload)}))
    relist(folder, "trainer.json")
    return "trainer.json is a pickle"


def plant_torch_save(folder: Path, payload: Path) -> str:
    torch.save({"innocent": CreatesAFile(payload)}, folder / "model.safetensors")
    relist(folder, "model.safetensors")
    return "model.safetensors is a zip"


def plant_text_pickle(folder: Path, payload: Path) -> str:
    # Protocol 0 has no magic byte: the safetensors reader refuses it as a file.
    (folder / "rng.safetensors").write_bytes(pickle.dumps(CreatesAFile(payload), protocol=0))
    relist(folder, "rng.safetensors")
    return "rng.safetensors is not a readable safetensors file"


def plant_unlisted_file(folder: Path, payload: Path) -> str:
    torch.save({"innocent": CreatesAFile(payload)}, folder / "extra.pt")
    return "extra.pt is not listed in the manifest"


@pytest.mark.parametrize("damage", [truncate, drop_manifest, flip_a_byte,
                                    plant_malicious_pickle, plant_torch_save,
                                    plant_text_pickle, plant_unlisted_file],
                         ids=lambda f: f.__name__)
def test_a_bad_newest_checkpoint_is_moved_aside_and_the_previous_used(
        damage, reference, tmp_path, capsys):
    out = copy_run(reference, tmp_path / "run")
    newest = out / "checkpoints" / "step-000000016"
    payload = tmp_path / "payload-ran"
    words = damage(newest, payload)
    files_before = sorted(p.name for p in newest.iterdir())
    summary = run_train(ARGS, out)
    log = capsys.readouterr().out
    assert not payload.exists(), "the pickle's payload must never run"
    warning = next(line for line in log.splitlines() if "skipping a bad checkpoint" in line)
    assert words in warning and "step-000000016" in warning
    assert "resumed from" in log and "step-000000015" in log
    moved = list((out / "checkpoints").glob("step-000000016.corrupt-*"))
    assert len(moved) == 1 and sorted(p.name for p in moved[0].iterdir()) == files_before
    # Step 16 ran again from step 15: the same weights as the reference.
    assert summary["model_sha256"] == reference[1]["model_sha256"]
    assert (out / "checkpoints" / "step-000000016" / MANIFEST).is_file()


def test_an_explicit_bad_checkpoint_exits_2_and_is_left_in_place(reference, tmp_path, capsys):
    out = copy_run(reference, tmp_path / "run")
    bad = out / "checkpoints" / "step-000000010"
    payload = tmp_path / "payload-ran"
    plant_malicious_pickle(bad, payload)
    with pytest.raises(SystemExit) as exit_info:
        train_main([*ARGS, "--resume", str(bad), "--output-dir", str(tmp_path / "new")])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "--resume" in err and "trainer.json is a pickle" in err
    assert not payload.exists() and bad.is_dir()


def test_the_planted_payload_is_real(tmp_path):
    # The malicious file above is honest: loaded the unsafe way, it does create the file.
    payload = tmp_path / "payload-ran"
    torch.save({"innocent": CreatesAFile(payload)}, tmp_path / "evil.pt")
    torch.load(tmp_path / "evil.pt", weights_only=False)
    assert payload.exists()


def old_format_checkpoint(folder: Path, payload: Path) -> Path:
    """A checkpoint as earlier versions wrote it: torch.save files, manifest format 1."""
    folder.mkdir()
    for name in ("model.pt", "optimizer.pt", "trainer.pt", "rng.pt"):
        torch.save({"innocent": CreatesAFile(payload)}, folder / name)
    files = {p.name: dict(bytes=p.stat().st_size, sha256=sha256_file(p))
             for p in folder.iterdir()}
    (folder / MANIFEST).write_text(json.dumps({"format": 1, "step": 99, "files": files}))
    return folder


@pytest.mark.parametrize("explicit", [False, True], ids=["auto", "path"])
def test_an_old_torch_save_checkpoint_is_refused_in_one_line_and_kept(
        explicit, reference, tmp_path, capsys):
    out = copy_run(reference, tmp_path / "run")
    old = old_format_checkpoint(out / "checkpoints" / "step-000000099", tmp_path / "payload")
    (out / "checkpoints" / "latest").write_text(old.name + "\n")  # its last save, as then
    before = sorted(p.name for p in old.iterdir())
    resume = ["--resume", str(old)] if explicit else []
    with pytest.raises(SystemExit) as exit_info:
        train_main([*ARGS, *resume, "--output-dir", str(out)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert "earlier version in the torch.save format" in err and "--resume never" in err
    assert sorted(p.name for p in old.iterdir()) == before, "never moved or changed"
    assert not (tmp_path / "payload").exists()


def test_a_second_writer_is_refused_and_the_first_s_checkpoints_stay_intact(tmp_path, capsys):
    import subprocess
    import sys
    import time

    from workload.runfolder import LOCK as LOCK_NAME
    from workload.checkpoint.writer.store import verify

    out = tmp_path / "run"
    first = subprocess.Popen([sys.executable, "-m", "workload.train", *ARGS, "--epochs", "4",
                              "--output-dir", str(out)], stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 120
    while not (out / LOCK_NAME).exists() and first.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    with pytest.raises(SystemExit) as stop:
        train_main([*ARGS, "--epochs", "4", "--max-steps", "3", "--output-dir", str(out)])
    err = capsys.readouterr().err
    log = first.communicate(timeout=600)[0]
    assert first.returncode == 0, log
    assert stop.value.code == 2
    assert f"PID {first.pid}" in err and "in use by another run" in err, err
    root = out / "checkpoints"
    assert steps_in(root) == ["step-000000028", "step-000000030", "step-000000032"]
    for name in steps_in(root):
        verify(root / name)
    lines = (out / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["epoch"] for line in lines] == [1, 2, 3, 4]
    assert not (out / LOCK_NAME).exists()


# --- `train` run twice as users run it: checkpoints kept, or moved aside in one line -------

# A model whose optimizer.safetensors starts with 0x80 (the low byte of its header's
# length), a pickle's first byte: 8 steps an epoch, a checkpoint every 5 and at epoch ends.
TWICE = [*ARGS, "--blocks-per-stage", "2", "--epochs", "4", "--checkpoint-every", "5"]


def train_command(out: Path, *extra: str) -> tuple[int, str]:
    """The `train` console script as a process: its exit status and its output."""
    done = subprocess.run([str(Path(sys.executable).parent / "train"), *TWICE, *extra,
                           "--output-dir", str(out)], capture_output=True, text=True,
                          timeout=600, env=clean_env(), check=False)
    return done.returncode, done.stdout + done.stderr


@pytest.fixture(scope="module")
def ten_steps(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("ten-steps") / "run"
    status, log = train_command(out, "--max-steps", "10")
    assert status == 0, log[-4000:]
    return out


def test_checkpoints_whose_safetensors_start_like_a_pickle_are_resumed(ten_steps, tmp_path):
    out = copy_run((ten_steps, {}), tmp_path / "run")
    root = out / "checkpoints"
    assert (root / "step-000000010" / "optimizer.safetensors").read_bytes()[:1] == b"\x80"
    status, log = train_command(out, "--max-steps", "15")
    assert status == 0, log[-4000:]
    assert "skipping a bad checkpoint" not in log and "Traceback" not in log
    assert f"resumed from {root / 'step-000000010'}: step 10" in log
    assert (root / "latest").read_text().strip() == "step-000000015"
    assert not list(root.glob("*.corrupt-*"))


def tamper_trainer(path: Path) -> str:
    """A trainer state behind a matching manifest: epoch 10^6, a run "done" untrained."""
    trainer = read_part(path, "trainer")
    for old in path.glob("trainer.*"):  # a save only makes new files (create_new)
        old.unlink()
    write_part(path, "trainer", dict(trainer, epoch=10**6))
    relist(path, "trainer.json")
    return "trainer.json is not a checkpoint's trainer.json: `epoch` is 1000000"


def nul_in_manifest(path: Path) -> str:
    manifest = json.loads((path / MANIFEST).read_text())
    manifest["files"]["a\x00b"] = dict(bytes=1, sha256="00")
    (path / MANIFEST).write_text(json.dumps(manifest))
    return "MANIFEST.json names 'a\\x00b', which is not a file inside"


@pytest.mark.parametrize("damage", [tamper_trainer, nul_in_manifest], ids=lambda f: f.__name__)
def test_damaged_content_is_moved_aside_in_one_line_and_the_one_before_resumed(
        damage, ten_steps, tmp_path):
    out = copy_run((ten_steps, {}), tmp_path / "run")
    root = out / "checkpoints"
    previous = steps_in(root)[-2]
    words = damage(root / "step-000000010")
    status, log = train_command(out, "--max-steps", "15")
    assert status == 0, log[-4000:]
    warnings = [line for line in log.splitlines() if "skipping a bad checkpoint" in line]
    assert len(warnings) == 1 and words in warnings[0], log[-4000:]
    assert "step-000000010" in warnings[0] and "Traceback" not in log
    assert len(list(root.glob("step-000000010.corrupt-*"))) == 1
    step = int(previous.split("-")[1])
    assert f"resumed from {root / previous}: step {step}" in log
    assert (root / "latest").read_text().strip() == "step-000000015"
