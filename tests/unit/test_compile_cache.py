"""The compile cache artifact is code the job will run: read only when it is the user's
own file that no one else may write, and unpacked only when every member stays inside the
two cache folders as a file or a folder."""

from __future__ import annotations

import os
import tarfile

import pytest

from tests.helpers import tar_member as member
from tests.helpers import tar_with
from workload.training.compile_cache import checked_members, trust_problem, unpack


@pytest.fixture
def folders(tmp_path):
    return {"inductor": tmp_path / "inductor", "triton": tmp_path / "triton"}


@pytest.mark.parametrize("bad, says", [
    (member("../inductor/x"), "outside the cache folders"),
    (member("/etc/passwd"), "outside the cache folders"),
    (member("inductor/../../x"), "outside the cache folders"),
    (member("home/.bashrc"), "outside the cache folders"),
    (member("inductor/link", tarfile.SYMTYPE, "/etc/passwd"), "not a file or a folder"),
    (member("triton/hard", tarfile.LNKTYPE, "inductor/a"), "not a file or a folder"),
    (member("inductor/dev", tarfile.CHRTYPE), "not a file or a folder"),
])
def test_a_hostile_member_refuses_the_whole_file_before_anything_is_written(
        tmp_path, folders, bad, says):
    path = tmp_path / "a.tar"
    tar_with(path, member("inductor/a"), bad)
    with tarfile.open(path) as tar, pytest.raises(ValueError, match=says):
        checked_members(tar, folders)
    assert not any(folder.exists() for folder in folders.values())


def test_good_members_land_in_their_folders_and_a_present_file_is_kept(tmp_path, folders):
    path = tmp_path / "a.tar"
    tar_with(path, member("inductor/fx/a"), member("triton/k/b.so"), data=b"kernel")
    (folders["triton"] / "k").mkdir(parents=True)
    (folders["triton"] / "k" / "b.so").write_bytes(b"mine")
    with tarfile.open(path) as tar:
        assert unpack(tar, checked_members(tar, folders), folders) == 1
    assert (folders["inductor"] / "fx" / "a").read_bytes() == b"kernel"
    assert (folders["triton"] / "k" / "b.so").read_bytes() == b"mine"


def test_a_file_others_may_write_or_a_link_is_not_read(tmp_path):
    path = tmp_path / "compile-cache-x.tar"
    tar_with(path, member("inductor/a"))
    path.chmod(0o644)
    assert trust_problem(os.lstat(path)) is None
    path.chmod(0o664)
    assert "others may write it" in trust_problem(os.lstat(path))
    link = tmp_path / "link.tar"
    link.symlink_to(path)
    assert trust_problem(os.lstat(link)) == "it is not a regular file"


@pytest.mark.root  # chown to another uid
def test_another_users_file_is_not_read(tmp_path):
    path = tmp_path / "compile-cache-x.tar"
    tar_with(path, member("inductor/a"))
    path.chmod(0o644)
    os.chown(path, 65533, 65533)
    assert trust_problem(os.lstat(path)) == "it belongs to uid 65533, not to you"


def test_a_file_of_other_versions_is_left_alone_with_one_line(tmp_path, monkeypatch, caplog):
    """A run folder carried to another torch or device: its file is not read, not removed,
    and the job compiles from scratch."""
    import torch

    from workload.runfolder import RunFolder
    from workload.training.compile_cache import CompileCache

    for var, name in (("TORCHINDUCTOR_CACHE_DIR", "inductor"), ("TRITON_CACHE_DIR", "triton")):
        monkeypatch.setenv(var, str(tmp_path / name))
    run = tmp_path / "run"
    run.mkdir()
    foreign = run / "compile-cache-000000000000.tar"
    tar_with(foreign, member("inductor/a"))
    foreign.chmod(0o644)
    cache = CompileCache(RunFolder(run), torch.device("cpu"), is_main=True)
    with caplog.at_level("INFO", logger="workload"):
        cache.load()
    lines = [r.getMessage() for r in caplog.records if "compile cache" in r.getMessage()]
    assert len(lines) == 1 and "made for other versions" in lines[0], lines
    assert cache.facts["files_loaded"] == 0 and foreign.exists()
    assert not (tmp_path / "inductor").exists()
