"""Folders reached through a descriptor (workload.held: make_held, rename_held,
remove_held, swappable_parent) and a save's OSError in one line (T1's kind), one function
at a time; the attacks themselves, as a second uid: tests/e2e/test_neighbour_swaps.py."""

from __future__ import annotations

import os

import pytest

from workload.checkpoint.writer.diskfull import SaveFailed, save_in_one_line
from workload.files import create_new, swappable_parent
from workload.held import let_go, make_held, remove_held, rename_held
from workload.logs import say


def test_a_held_folder_renamed_away_is_still_the_one_written_and_renamed(tmp_path):
    """What a neighbour does in a group-writable folder, done here by the same user: the
    folder renamed away and a link to another folder put at its name."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    held = make_held(tmp_path / ".tmp-step-1")
    try:
        assert os.stat(held).st_mode & 0o777 == 0o700
        os.rename(tmp_path / ".tmp-step-1", tmp_path / "moved")
        (tmp_path / ".tmp-step-1").symlink_to(elsewhere)
        os.close(create_new(held / "model.safetensors"))
        rename_held(held, tmp_path / "step-1")
    finally:
        let_go(held)
    assert list(elsewhere.iterdir()) == []
    assert (tmp_path / "step-1" / "model.safetensors").is_file()
    assert (tmp_path / ".tmp-step-1").is_symlink() and not (tmp_path / "moved").exists()


def test_a_held_folder_removed_is_never_the_one_put_at_its_name(tmp_path):
    held = make_held(tmp_path / ".tmp-step-1")
    os.rename(tmp_path / ".tmp-step-1", tmp_path / "moved")
    (tmp_path / ".tmp-step-1").mkdir()  # someone else's, at the name
    try:
        remove_held(held, tmp_path)
    finally:
        let_go(held)
    assert (tmp_path / ".tmp-step-1").is_dir() and not (tmp_path / "moved").exists()


@pytest.mark.parametrize("put", ["link", "file"])
def test_what_is_put_at_a_new_folders_name_before_its_open_is_someone_elses(tmp_path,
                                                                            monkeypatch, put):
    """The instant between make_held's mkdir and its open: whatever is at the name then
    (a link, a file; another user's folder: tests/e2e/test_neighbour_swaps.py) was put
    there by someone else, and the one line says so."""
    folder, real_mkdir = tmp_path / ".tmp-step-1", os.mkdir

    def mkdir_then_swapped(path, mode=0o777):
        real_mkdir(path, mode)
        os.rename(path, tmp_path / "moved")
        if put == "link":
            os.symlink(tmp_path / "moved", path)
        else:
            os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o600))

    monkeypatch.setattr(os, "mkdir", mkdir_then_swapped)
    with pytest.raises(OSError) as raised:
        make_held(folder)
    what = "a symbolic link" if put == "link" else "not a folder"
    assert raised.value.strerror == (f"{folder} is {what}, not a folder of this run: "
                                     "someone else put it there")


def test_a_held_folder_gone_from_its_parent_is_one_line(tmp_path):
    (tmp_path / "parent").mkdir()
    held = make_held(tmp_path / "parent" / ".tmp-step-1")
    os.rename(tmp_path / "parent" / ".tmp-step-1", tmp_path / "out")
    try:
        with pytest.raises(OSError, match="renamed away by someone else"):
            rename_held(held, tmp_path / "parent" / "step-1")
    finally:
        let_go(held)


@pytest.mark.parametrize("mode, swappable", [(0o2775, True), (0o777, True), (0o1777, False),
                                             (0o755, False)])
def test_a_folder_others_may_write_without_the_sticky_bit_is_named(tmp_path, mode,
                                                                   swappable):
    folder = tmp_path / "node"
    folder.mkdir()
    folder.chmod(mode)
    inner = folder / "mine"
    inner.mkdir(mode=0o700)
    problem = swappable_parent(inner)
    assert (problem is not None) == swappable, problem
    if swappable:
        assert problem.startswith(f"{folder} may be written by others") and "sticky" in problem


def test_a_save_that_meets_a_file_in_its_way_is_one_line(tmp_path):
    """T1: a file at a checkpoint file's name (FileExistsError) ends the save in one line
    naming the step and the file, as the writer process's failure does."""
    (tmp_path / "model.safetensors").write_bytes(b"theirs")
    with pytest.raises(SaveFailed) as failed, save_in_one_line(7, tmp_path):
        create_new(tmp_path / "model.safetensors")
    line = str(failed.value)
    assert "\n" not in line and line.startswith("the checkpoint save could not save step 7: "
                                                "FileExistsError")
    assert str(tmp_path / "model.safetensors") in line


def test_a_line_names_a_held_folder_where_it_is_now_never_by_its_descriptor(tmp_path,
                                                                              capsys):
    folder = tmp_path / "run"
    held = make_held(folder)
    moved = tmp_path / "renamed"
    folder.rename(moved)  # a neighbour's rename: the line follows the folder itself
    say(f"could not write {held / 'steps.jsonl'} ({held})")
    let_go(held)
    say(f"after its end: {held / 'x'}")  # gone: left as it is, never another folder's name
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"could not write {moved / 'steps.jsonl'} ({moved})"
    assert lines[1] == f"after its end: {held / 'x'}"
