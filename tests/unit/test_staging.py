"""Staging to node-local storage, one process: copy or unpack, verify, reuse, refuse."""

from __future__ import annotations

import json

import pytest

from tests.helpers import tar_folder, write_image_folder
from workload.data.staging import data_root, listing, stage_once, staged_name
from workload.errors import UsageError


def test_a_tar_is_unpacked_verified_and_reused(tmp_path):
    pets = write_image_folder(tmp_path / "pets", classes=2, per_class=2)
    tar = tar_folder(pets, tmp_path / "pets.tar")
    target = tmp_path / "local" / staged_name(tar)
    said = stage_once(tar, target)
    assert "staged" in said and "8 files" in said and target.name == "pets"
    assert data_root(target) == target / "pets"
    assert listing(target / "pets") == listing(pets)
    manifest = json.loads((tmp_path / "local" / "pets.manifest.json").read_text())
    assert len(manifest["files"]) == 8
    assert "reusing" in stage_once(tar, target)
    # A staged file gone (a node's cleaned-up $TMPDIR): staged again, not reused.
    (target / "pets" / "train" / "cat" / "0.jpg").unlink()
    assert "staged" in stage_once(tar, target)
    assert listing(target / "pets") == listing(pets)


def test_a_folder_is_copied_and_a_changed_source_staged_again(tmp_path):
    data = write_image_folder(tmp_path / "data", classes=1, per_class=2, splits=("train",))
    target = tmp_path / "local" / "data"
    assert "staged" in stage_once(data, target)
    assert data_root(target) == target
    assert "reusing" in stage_once(data, target)
    (data / "train" / "cat" / "2.jpg").write_bytes(b"new")
    assert "staged" in stage_once(data, target)
    assert (target / "train" / "cat" / "2.jpg").read_bytes() == b"new"


def test_a_broken_tar_is_refused(tmp_path):
    bad = tmp_path / "bad.tar"
    bad.write_bytes(b"not a tar at all" * 100)
    with pytest.raises(UsageError, match="bad.tar is not a readable tar file"):
        stage_once(bad, tmp_path / "local" / "bad")
    assert list((tmp_path / "local").iterdir()) == []  # no partial copy left behind
