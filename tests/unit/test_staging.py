"""Staging to node-local storage, one process: copy or unpack, verify, reuse, refuse."""

from __future__ import annotations

import fcntl
import json
import os
import socket
import tarfile

import pytest

from tests.helpers import tar_folder, tar_with, write_image_folder
from tests.helpers import tar_member as member
from workload.data.staging import data_root, stage_once
from workload.data.stagefiles import identity, listing, staged_name
from workload.errors import UsageError


def others(folder):
    """What is in `folder` besides stagings' lock files (empty files, see stagefiles.py)."""
    return sorted(p.name for p in folder.iterdir() if not p.name.endswith(".lock"))


def staged_data(tmp_path):
    """A one-class image folder staged once into tmp_path/local: (data, local, staging)."""
    data = write_image_folder(tmp_path / "data", classes=1, per_class=2, splits=("train",))
    local = tmp_path / "local"
    return data, local, stage_once(data, local)[0]


def test_a_tar_is_unpacked_verified_and_reused(tmp_path):
    pets = write_image_folder(tmp_path / "pets", classes=2, per_class=2)
    tar = tar_folder(pets, tmp_path / "pets.tar")
    target, said = stage_once(tar, tmp_path / "local")
    assert "staged" in said and "8 files" in said and target.name.startswith("pets-")
    assert data_root(target) == target / "pets"
    assert listing(target / "pets") == listing(pets)
    manifest = json.loads((tmp_path / "local" / f"{target.name}.manifest.json").read_text())
    assert len(manifest["files"]) == 8
    assert "reusing" in stage_once(tar, tmp_path / "local")[1]
    # A staged file gone (a node's cleaned-up $TMPDIR): staged again, not reused.
    (target / "pets" / "train" / "cat" / "0.jpg").unlink()
    assert "staged" in stage_once(tar, tmp_path / "local")[1]
    assert listing(target / "pets") == listing(pets)


def test_a_folder_rewritten_with_the_same_sizes_and_times_is_staged_again(tmp_path):
    data = write_image_folder(tmp_path / "data", classes=1, per_class=2, splits=("train",))
    local = tmp_path / "local"
    first, said = stage_once(data, local)
    assert "staged" in said and data_root(first) == first
    assert "reusing" in stage_once(data, local)[1]
    image = data / "train" / "cat" / "1.jpg"
    before = image.stat()
    image.write_bytes(bytes(reversed(image.read_bytes())))  # same size; mtime put back
    os.utime(image, ns=(before.st_atime_ns, before.st_mtime_ns))
    second, said = stage_once(data, local)
    assert "staged" in said and second != first
    assert (second / "train" / "cat" / "1.jpg").read_bytes() == image.read_bytes()
    assert f"removed the older staging {first.name}" in said and not first.exists()
    assert others(local) == sorted([second.name, f"{second.name}.manifest.json"])


def test_an_older_staging_that_another_job_reads_is_kept(tmp_path):
    data = write_image_folder(tmp_path / "data", classes=1, per_class=2, splits=("train",))
    local = tmp_path / "local"
    first, _ = stage_once(data, local)
    # Another job on the node trains from it: its stager holds the lock (another open file).
    other_job = os.open(local / f".{first.name}.lock", os.O_RDONLY)
    fcntl.flock(other_job, fcntl.LOCK_SH)
    (data / "train" / "cat" / "0.jpg").write_bytes(b"changed")
    second, said = stage_once(data, local)
    assert f"kept the older staging {first.name}: another job reads it" in said
    manifest = json.loads((local / f"{first.name}.manifest.json").read_text())
    assert listing(first) == manifest["files"]
    os.close(other_job)  # that job ended
    assert f"removed the older staging {first.name}" in stage_once(data, local)[1]
    assert not first.exists() and second.is_dir()


def test_a_partial_copy_a_killed_stager_left_is_removed_unless_another_job_holds_it(
        tmp_path):
    """A stager ended by SIGKILL (SLURM's, after the grace time) leaves its partial copy:
    the next stager of that staging removes it once it holds the staging's lock alone,
    and keeps it while another job on the node holds it (a live stager copying there)."""
    data, local, first = staged_data(tmp_path)
    dead = local / f".{first.name}.partial-nid001-4242-x1y2"
    (dead / "train" / "cat").mkdir(parents=True)
    (dead / "train" / "cat" / "0.jpg").write_bytes(b"half")
    other_job = os.open(local / f".{first.name}.lock", os.O_RDONLY)
    fcntl.flock(other_job, fcntl.LOCK_SH)
    (first / "train" / "cat" / "0.jpg").unlink()  # staged again, while the other job holds it
    with pytest.raises(UsageError):  # the damaged staging is refused while another holds it
        stage_once(data, local)
    assert dead.is_dir()
    os.close(other_job)
    again, said = stage_once(data, local)
    assert again == first and not dead.exists(), said
    assert f"removed the partial copy {dead.name}, left by a stager that ended before it " \
        "was done" in said
    assert others(local) == sorted([first.name, f"{first.name}.manifest.json"])


def test_an_older_staging_goes_with_its_partial_copies(tmp_path):
    data, local, first = staged_data(tmp_path)
    dead = local / f".{first.name}.partial-nid001-4242-x1y2"
    dead.mkdir()
    (data / "train" / "cat" / "0.jpg").write_bytes(b"changed")
    second, said = stage_once(data, local)
    assert f"removed the older staging {first.name}" in said and not dead.exists()
    assert others(local) == sorted([second.name, f"{second.name}.manifest.json"])


def test_a_folder_train_did_not_make_is_never_replaced(tmp_path):
    data = write_image_folder(tmp_path / "data", classes=1, per_class=2, splits=("train",))
    local = tmp_path / "local"
    mine = local / "data"  # the user's own folder of the data folder's name: not touched
    mine.mkdir(parents=True)
    (mine / "notes.txt").write_text("mine")
    target, _ = stage_once(data, local)
    assert (mine / "notes.txt").read_text() == "mine"
    # A folder where the staging would go, without its manifest: refused, kept as it is.
    for path in target.parent.glob(f"{target.name}*"):
        path.unlink() if path.is_file() else os.rename(path, tmp_path / "moved")
    (tmp_path / "moved" / "train" / "cat" / "0.jpg").write_bytes(b"the user's")
    os.rename(tmp_path / "moved", target)
    with pytest.raises(UsageError, match=f"{target} exists but was not made by --stage-to"):
        stage_once(data, local)
    assert (target / "train" / "cat" / "0.jpg").read_bytes() == b"the user's"


def test_a_fifo_at_a_stagings_manifest_is_no_manifest_not_a_hang(tmp_path):
    # The node-local folder may be shared ($TMPDIR): a FIFO planted at the manifest's name
    # would hold a reader of it forever.
    data, local, target = staged_data(tmp_path)
    manifest = local / f"{target.name}.manifest.json"
    manifest.unlink()
    os.mkfifo(manifest)
    with pytest.raises(UsageError, match=f"{target} exists but was not made by --stage-to"):
        stage_once(data, local)


def staging_of(data, local):
    """Where stage_once will put `data` in `local`: the names a neighbour can foresee."""
    return local / f"{staged_name(data)}-{identity(data)[:16]}"


def test_a_link_planted_at_the_partial_copy_s_name_takes_no_copy_elsewhere(tmp_path):
    """A neighbour in a shared node-local folder puts a link where the partial copy was
    named from the host and PID: the copy went through it into the neighbour's folder,
    which then became the staging train reads."""
    data = write_image_folder(tmp_path / "data", classes=1, per_class=2, splits=("train",))
    local, theirs = tmp_path / "local", tmp_path / "neighbours"
    local.mkdir()
    theirs.mkdir()
    target = staging_of(data, local)
    partial = f".{target.name}.partial-{socket.gethostname()}-{os.getpid()}"
    (local / partial).symlink_to(theirs)
    assert stage_once(data, local)[0] == target
    assert list(theirs.iterdir()) == [], "nothing written through the link"
    assert not target.is_symlink() and (target / "train" / "cat" / "0.jpg").is_file()
    assert (local / partial).is_symlink(), "the neighbour's link left alone"


def test_a_link_planted_at_a_staging_s_lock_is_one_line_and_not_followed(tmp_path):
    """The lock file was opened with O_CREAT through a link: a file of the neighbour's
    choosing made wherever the user may write."""
    data = write_image_folder(tmp_path / "data", classes=1, per_class=2, splits=("train",))
    local, victim = tmp_path / "local", tmp_path / "victim"
    local.mkdir()
    victim.mkdir()
    lock = local / f".{staging_of(data, local).name}.lock"
    lock.symlink_to(victim / "made-by-the-link")
    with pytest.raises(UsageError) as error:
        stage_once(data, local)
    assert str(error.value) == (f"{lock} is a symbolic link, where train keeps a lock file; "
                                f"someone else put it there: move it away (mv {lock} "
                                f"{lock}.moved), or pass another folder")
    assert list(victim.iterdir()) == []


@pytest.mark.parametrize("loops", [1, 2])
def test_link_loops_in_the_source_are_refused_before_copying(tmp_path, loops):
    data = write_image_folder(tmp_path / "data", classes=1, per_class=2, splits=("train",))
    for k in range(loops):
        (data / "train" / "cat" / f"loop{k}").symlink_to(data / "train")
    with pytest.raises(UsageError, match="a symbolic link loop.*remove the link"):
        stage_once(data, tmp_path / "local")
    assert not (tmp_path / "local").exists()  # refused before anything was made


def test_a_broken_tar_is_refused(tmp_path):
    bad = tmp_path / "bad.tar"
    bad.write_bytes(b"not a tar at all" * 100)
    with pytest.raises(UsageError, match="bad.tar is not a readable tar file"):
        stage_once(bad, tmp_path / "local")
    assert list((tmp_path / "local").iterdir()) == []  # no partial copy left behind


# Unpacked by the package itself, on every Python it accepts: tarfile's extraction filters
# (PEP 706) are missing before 3.10.12 and 3.11.4, and Debian 12's python3 is 3.11.2.
@pytest.mark.parametrize("unsafe, why", [
    (member("/tmp/pets/train/cat/0.jpg"), "is an absolute path or leads out with '..'"),
    (member("pets/../../escape.jpg"), "is an absolute path or leads out with '..'"),
    (member("pets/train/cat/1.jpg", tarfile.SYMTYPE, "/home/user/.bashrc"),
     "is a link or a special file"),
    (member("pets/train/cat/1.jpg", tarfile.SYMTYPE, "0.jpg"), "is a link or a special file"),
    (member("pets/train/cat/1.jpg", tarfile.LNKTYPE, "pets/train/cat/0.jpg"),
     "is a link or a special file"),
    (member("pets/train/cat/1.jpg", tarfile.FIFOTYPE), "is a link or a special file"),
    (member("pets/train/cat/1.jpg", tarfile.CHRTYPE), "is a link or a special file"),
], ids=["absolute", "dot-dot", "symlink-out", "symlink-in", "hardlink", "fifo", "device"])
def test_a_tar_with_an_unsafe_member_says_so_and_leaves_nothing(tmp_path, unsafe, why):
    tar = tar_with(tmp_path / "pets.tar", member("pets/train/cat/0.jpg"), unsafe)
    with pytest.raises(UsageError) as error:
        stage_once(tar, tmp_path / "local")
    said = str(error.value)
    assert f"pets.tar holds a member with an unsafe name or link ('{unsafe.name}' {why}" in said
    assert "\n" not in said and "not a readable tar" not in said
    assert list((tmp_path / "local").iterdir()) == []


@pytest.mark.parametrize("second", [
    member("pets/a.jpg"), member("pets/a.jpg", tarfile.DIRTYPE),
    member("pets/a.jpg/b.jpg"), member("pets/a.jpg/b/c.jpg")],
    ids=["a file twice", "a file then a folder", "a file under the file",
         "a folder under the file"])
def test_a_tar_holding_a_name_twice_is_refused_and_leaves_nothing(tmp_path, second):
    tar = tar_with(tmp_path / "pets.tar", member("pets/a.jpg"), second)
    with pytest.raises(UsageError) as error:
        stage_once(tar, tmp_path / "local")
    said = str(error.value)
    assert f"pets.tar holds '{second.name}' twice, or as a file and a folder" in said, said
    assert list((tmp_path / "local").iterdir()) == []


def test_a_tar_of_dot_relative_names_unpacks_its_files_only(tmp_path):
    tar = tar_with(tmp_path / "pets.tar", member("./pets", tarfile.DIRTYPE),
                 member("./pets/train/cat/0.jpg"), member("pets/train/dog", tarfile.DIRTYPE))
    target, said = stage_once(tar, tmp_path / "local")
    assert "(1 files," in said, said
    assert listing(target / "pets") == {"train/cat/0.jpg": 3}
    assert (target / "pets" / "train" / "dog").is_dir()


def test_without_file_locks_staging_works_and_keeps_older_stagings(tmp_path, monkeypatch):
    import errno

    def no_locks(fd, how):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr("workload.data.stagefiles.fcntl.flock", no_locks)
    data = write_image_folder(tmp_path / "data", classes=1, per_class=2, splits=("train",))
    first, said = stage_once(data, tmp_path / "local")
    assert "staged" in said
    (data / "train" / "cat" / "0.jpg").write_bytes(b"changed")
    second, said = stage_once(data, tmp_path / "local")
    assert f"kept the older staging {first.name}: " in said and "no file locks (flock)" in said
    assert first.is_dir() and (second / "train" / "cat" / "0.jpg").read_bytes() == b"changed"
