"""The checkpoint store on its own: atomic layout, manifest verification, pruning, moving
bad checkpoints aside, and loading that never runs code (safetensors and JSON only). No
training here."""

from __future__ import annotations

import hashlib
import json
import os
import pickle

import pytest
import torch

from workload.checkpoint.writer.durable import HASH_IN_A_THREAD, write_durably
from workload.checkpoint.formats import read_part, read_tensors, safetensors_bytes
from workload.checkpoint.writer.folder import complete_steps, move_aside, prune, step_name
from workload.checkpoint.inprocess import save_checkpoint
from workload.checkpoint.writer.store import (MANIFEST, CorruptCheckpoint, OldFormat, Snapshot,
                                              verify)
from workload.files import sha256_file


def snapshot(step: int, model: dict | None = None) -> Snapshot:
    trainer = dict(step=step, epoch=0, batch=step, world_size=1)
    return Snapshot(model=model or {"w": torch.full((3,), float(step))}, optimizer={"state": {}},
                    trainer=trainer, rng=[{"torch": torch.get_rng_state()}],
                    config={"seed": 1})


def save(root, step: int, keep: int = 3, model: dict | None = None):
    return save_checkpoint(root, snapshot(step, model), keep, is_main=True)


def test_a_save_is_complete_verified_and_pointed_to(tmp_path):
    path = save(tmp_path, 7)
    manifest = verify(path)
    assert manifest["step"] == 7
    assert set(manifest["files"]) == {"model.safetensors", "optimizer.json", "trainer.json",
                                      "rng.json", "rng.safetensors", "config.json"}
    assert (tmp_path / "latest").read_text().strip() == "step-000000007"
    assert not list(tmp_path.glob(".tmp-*"))
    assert torch.equal(read_tensors(path / "model.safetensors")["w"], torch.full((3,), 7.0))
    assert read_part(path, "trainer") == snapshot(7).trainer


def test_a_save_writes_each_file_once_and_reads_none_back(tmp_path, monkeypatch):
    # Each byte is hashed from memory as it is written: the manifest is built without
    # opening a file of the checkpoint again (a 137 MB state would be read twice).
    import builtins
    import io

    opened, real_open = [], builtins.open

    def spy(file, mode="r", *args, **kwargs):
        opened.append((str(file), mode))
        return real_open(file, mode, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", spy)
    monkeypatch.setattr(io, "open", spy)
    path = save(tmp_path, 5)
    monkeypatch.undo()
    mine = [(f, m) for f, m in opened if f.startswith(str(tmp_path))]
    assert [f for f, m in mine if "r" in m] == []
    written = [f.replace(".tmp-", "") for f, m in mine if "w" in m]
    assert len(written) == len(set(written))  # each file written once
    assert set(verify(path)["files"]) == {"model.safetensors", "optimizer.json",
                                          "trainer.json", "rng.json", "rng.safetensors",
                                          "config.json"}


def test_pruning_keeps_the_newest(tmp_path):
    for step in (1, 2, 3, 4):
        save(tmp_path, step, keep=2)
    assert [s for s, _ in complete_steps(tmp_path)] == [3, 4]
    # Pruning counts only checkpoints up to the one just saved (3): a newer one left by
    # another writer is never what makes it delete.
    prune(tmp_path, keep=1, newest=3)
    assert [s for s, _ in complete_steps(tmp_path)] == [3, 4]


@pytest.mark.parametrize("damage, words", [
    (lambda p: (p / MANIFEST).unlink(), "no MANIFEST.json"),
    (lambda p: (p / MANIFEST).write_text("{not json"), "not a readable manifest"),
    (lambda p: (p / "model.safetensors").unlink(), "model.safetensors is missing"),
    (lambda p: (p / "rng.json").write_bytes(b"short"), "rng.json has 5 bytes"),
    (lambda p: (p / MANIFEST).write_text('{"format": 3, "files": {}}'), "format 3"),
    (lambda p: (p / "config.json").write_text('{\n  "seed": 2\n}\n'), "sha256"),
])
def test_damage_is_found_and_named(tmp_path, damage, words):
    path = save(tmp_path, 3)
    damage(path)
    with pytest.raises(CorruptCheckpoint, match=words):
        verify(path)


def test_moving_aside_keeps_the_folder_and_removes_the_candidate(tmp_path):
    path = save(tmp_path, 5)
    moved = move_aside(path, "corrupt")
    assert moved.name.startswith("step-000000005.corrupt-") and moved.is_dir()
    assert complete_steps(tmp_path) == []


class RunsCode:
    def __reduce__(self):
        return (print, ("this ran",))


@pytest.mark.parametrize("protocol", [0, 2, 5])
@pytest.mark.parametrize("name", ["model.safetensors", "rng.json", "evil.pkl"])
def test_a_pickle_anywhere_is_refused_without_running(tmp_path, capsys, protocol, name):
    # Protocols 2 and later start with 0x80 and are refused by their first byte; protocol
    # 0 is text, and neither the safetensors nor the JSON reader makes sense of it.
    path = save(tmp_path, 3)
    (path / name).write_bytes(pickle.dumps({"x": RunsCode()}, protocol=protocol))
    with pytest.raises(CorruptCheckpoint, match=name):
        verify(path)
        read_tensors(path / "model.safetensors")
        read_part(path, "rng")
    assert "this ran" not in capsys.readouterr().out


def test_a_torch_save_file_is_refused_by_its_first_bytes(tmp_path):
    path = save(tmp_path, 3)
    torch.save({"w": torch.ones(3)}, path / "model.safetensors")
    manifest = json.loads((path / MANIFEST).read_text())
    manifest["files"]["model.safetensors"] = dict(
        bytes=(path / "model.safetensors").stat().st_size,
        sha256=sha256_file(path / "model.safetensors"))
    (path / MANIFEST).write_text(json.dumps(manifest))
    verify(path)  # a forger rewrote the manifest: the safetensors parser refuses the file
    with pytest.raises(CorruptCheckpoint, match="model.safetensors is a zip"):
        read_tensors(path / "model.safetensors")


def test_a_safetensors_file_whose_length_starts_like_a_pickle_is_read(tmp_path):
    # A safetensors file starts with its header's length (u64 little-endian): one in 32
    # headers has 0x80 as its low byte, which is also a pickle's first byte.
    name = next(f"w{'x' * n}" for n in range(300)
                if safetensors_bytes({f"w{'x' * n}": torch.ones(2)})[0] == 0x80)
    path = save(tmp_path, 3, model={name: torch.ones(2)})
    assert (path / "model.safetensors").read_bytes()[:1] == b"\x80"
    verify(path)
    assert torch.equal(read_tensors(path / "model.safetensors")[name], torch.ones(2))


def test_a_checkpoint_of_the_torch_save_format_is_old_not_corrupt(tmp_path):
    path = tmp_path / step_name(4)
    path.mkdir()
    torch.save({"w": torch.ones(3)}, path / "model.pt")
    (path / MANIFEST).write_text(json.dumps({"format": 1, "files": {}}))
    with pytest.raises(OldFormat, match="earlier version.*--resume never --overwrite"):
        verify(path)
    (path / MANIFEST).unlink()  # an unfinished save of that format: the same answer
    with pytest.raises(OldFormat):
        verify(path)


def test_manifest_is_plain_json(tmp_path):
    manifest = json.loads((save(tmp_path, 2) / MANIFEST).read_text())
    assert all(set(entry) == {"bytes", "sha256"} for entry in manifest["files"].values())


@pytest.mark.parametrize("size", [0, 300, HASH_IN_A_THREAD, 3 * HASH_IN_A_THREAD + 7],
                         ids=["empty", "json-sized", "threshold", "hashed-in-a-thread"])
def test_a_durable_write_records_the_bytes_it_wrote(tmp_path, size):
    data = os.urandom(size)
    entry = write_durably(tmp_path / "f", data)
    written = (tmp_path / "f").read_bytes()
    assert written == data
    assert entry == dict(bytes=size, sha256=hashlib.sha256(written).hexdigest())
