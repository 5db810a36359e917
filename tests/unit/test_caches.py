"""The cache folders a command chooses at start (workload/caches.py): node-local, this
user's own, never a folder someone else made or planted. One function at a time, on an
environment given as a dict; tests/e2e/test_cache_users.py runs the commands as two users
on one temp folder."""

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO
from workload import caches
from workload.caches import CACHE_FOLDERS, ROOT_VARIABLE, choose_caches, user_cache_problems

UID = os.getuid()


def shared_tmp(tmp_path):
    """A temp folder as /tmp is: everyone may create in it, sticky."""
    tmp = tmp_path / "tmp"
    tmp.mkdir(mode=0o1777)
    tmp.chmod(0o1777)
    return tmp


def test_every_unset_cache_goes_to_this_users_own_folder_under_the_temp_folder(tmp_path):
    tmp = shared_tmp(tmp_path)
    env = {"TMPDIR": str(tmp)}
    plan = choose_caches(env)
    own = tmp / f"hpc-train-{UID}"
    assert plan.root == own and not plan.notes and not plan.yours
    assert {v: env[v] for v in CACHE_FOLDERS} == {
        v: str(own / name) for v, name in CACHE_FOLDERS.items()}
    assert env[ROOT_VARIABLE] == str(own)
    assert stat.S_IMODE(own.stat().st_mode) == 0o700 and own.stat().st_uid == UID


def test_slurm_tmpdir_wins_over_the_temp_folder(tmp_path):
    local = tmp_path / "localscratch"
    local.mkdir()
    env = {"TMPDIR": str(shared_tmp(tmp_path)), "SLURM_TMPDIR": str(local)}
    choose_caches(env)
    assert env["TORCHINDUCTOR_CACHE_DIR"] == str(local / "hpc-train-cache" / "inductor")
    assert env["TRITON_CACHE_DIR"] == str(local / "hpc-train-cache" / "triton")


def test_a_slurm_tmpdir_not_bound_into_the_container_falls_back_with_the_fix(tmp_path):
    tmp = shared_tmp(tmp_path)
    env = {"TMPDIR": str(tmp), "SLURM_TMPDIR": str(tmp_path / "not-bound")}
    plan = choose_caches(env)
    assert plan.root == tmp / f"hpc-train-{UID}"
    note, = plan.notes
    assert "not-bound" in note and "--bind $SLURM_TMPDIR" in note
    # pyxis mounts with its own option (docs/sites/pyxis.md, "The node-local folder").
    assert "--container-mounts=$SLURM_TMPDIR" in note


def test_the_users_own_value_wins_and_is_only_checked(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    env = {"TMPDIR": str(shared_tmp(tmp_path)), "TRITON_CACHE_DIR": str(blocker / "triton"),
           "MPLCONFIGDIR": str(tmp_path / "mpl")}
    plan = choose_caches(env)
    assert plan.yours == {"TRITON_CACHE_DIR": str(blocker / "triton"),
                          "MPLCONFIGDIR": str(tmp_path / "mpl")}
    assert env["TRITON_CACHE_DIR"] == str(blocker / "triton"), "the user's value is kept"
    problem = user_cache_problems(env)
    assert list(problem) == ["TRITON_CACHE_DIR"]
    assert "not writable" in problem["TRITON_CACHE_DIR"] and "unset it" in problem[
        "TRITON_CACHE_DIR"] and "\n" not in problem["TRITON_CACHE_DIR"]


def test_the_packages_own_choice_is_not_counted_as_the_users(tmp_path):
    """A child (torchrun's worker, a script after entrypoint.sh) inherits the values its
    parent chose: they stay the package's, and a missing folder is made again."""
    tmp = shared_tmp(tmp_path)
    parent = {"TMPDIR": str(tmp)}
    choose_caches(parent)
    os.rmdir(parent[ROOT_VARIABLE])  # another node: the folder is not there
    child = dict(parent)
    plan = choose_caches(child)
    assert not plan.yours and child == parent and not plan.notes
    assert os.path.isdir(child[ROOT_VARIABLE])
    assert user_cache_problems(child) == {}


def test_inductors_default_inherited_from_a_python_that_imported_torch_is_replaced(tmp_path):
    """torch._dynamo's import writes TORCHINDUCTOR_CACHE_DIR=/tmp/torchinductor_<user>
    into its process's environment, and a child run as another uid (a launcher, a test
    runner) inherits it: not the user's value, and no folder of this user's."""
    tmp = shared_tmp(tmp_path)
    env = {"TMPDIR": str(tmp), "TORCHINDUCTOR_CACHE_DIR": "/tmp/torchinductor_someone"}
    plan = choose_caches(env)
    assert env["TORCHINDUCTOR_CACHE_DIR"] == str(tmp / f"hpc-train-{UID}" / "inductor")
    assert plan.yours == {} and user_cache_problems(env) == {}
    mine = {"TMPDIR": str(tmp), "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "torchinductor_x")}
    assert choose_caches(mine).yours == {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path /
                                                                        "torchinductor_x")}


@pytest.mark.root  # only root can give a folder to another uid
def test_a_folder_of_another_uid_is_not_used(tmp_path):
    """Someone else made /tmp/hpc-train-<my uid> first: a fresh folder for this job."""
    tmp = shared_tmp(tmp_path)
    taken = tmp / f"hpc-train-{UID}"
    taken.mkdir(mode=0o777)
    os.chown(taken, UID + 1, UID + 1)
    env = {"TMPDIR": str(tmp)}
    plan = choose_caches(env)
    assert plan.root != taken and plan.root.parent == tmp
    assert plan.root.name.startswith(f"hpc-train-{UID}-")
    assert stat.S_IMODE(plan.root.stat().st_mode) == 0o700
    note, = plan.notes
    assert f"belongs to uid {UID + 1}" in note and str(plan.root) in note
    assert not any(taken.iterdir()), "nothing was written into the other user's folder"


def test_a_planted_symbolic_link_is_not_followed(tmp_path):
    tmp = shared_tmp(tmp_path)
    target = tmp_path / "elsewhere"
    target.mkdir(mode=0o755)
    target.chmod(0o755)
    (tmp / f"hpc-train-{UID}").symlink_to(target)
    env = {"TMPDIR": str(tmp)}
    plan = choose_caches(env)
    assert plan.root.parent == tmp and not plan.root.is_symlink()
    assert "is a symbolic link" in plan.notes[0]
    assert not any(target.iterdir())
    assert stat.S_IMODE(target.stat().st_mode) == 0o755, "the link's target is not changed"


def test_a_loose_mode_of_the_users_own_folder_is_closed(tmp_path):
    tmp = shared_tmp(tmp_path)
    own = tmp / f"hpc-train-{UID}"
    own.mkdir()
    own.chmod(0o777)
    choose_caches({"TMPDIR": str(tmp)})
    assert stat.S_IMODE(own.stat().st_mode) == 0o700


def test_nothing_is_chosen_when_the_user_set_every_cache(tmp_path):
    env = {v: str(tmp_path / v) for v in CACHE_FOLDERS}
    plan = choose_caches(env)
    assert plan.root is None and ROOT_VARIABLE not in env and plan.yours == env


def test_a_temp_folder_on_a_shared_file_system_is_passed_over_for_tmp(tmp_path, monkeypatch):
    """Some sites point TMPDIR at the parallel file system: a file per compiled kernel
    there fills the inode quota, so the caches go to /tmp, with a line saying why."""
    scratch = tmp_path / "scratch-tmp"
    scratch.mkdir()
    mounts = tmp_path / "mounts"
    mounts.write_text(f"/dev/sda1 / ext4 rw 0 0\nlustre@o2ib:/fs {scratch} lustre rw 0 0\n")
    monkeypatch.setattr(caches, "MOUNTS_FILE", mounts)
    env = {"TMPDIR": str(scratch)}
    plan = choose_caches(env)
    assert plan.root == Path("/tmp") / f"hpc-train-{UID}"
    assert env["TRITON_CACHE_DIR"] == str(plan.root / "triton")
    note, = plan.notes
    assert "lustre, a shared file system" in note and "export TMPDIR=" in note
    assert not any(scratch.iterdir()), "nothing was made on the shared file system"


# Each command's start up to its cache choice, stopped there: torch must not be loaded yet
# (torchvision's import fixes Inductor's folder to torch's default, which would then
# count as the user's value).
CHOICE_PROBE = """
import sys
import workload.caches as caches

def stop(env=None):
    print("torch" in sys.modules, "torchvision" in sys.modules)
    raise SystemExit(0)

caches.choose_caches = stop
command = sys.argv[1]
if command == "train":
    from workload.train import main; main(["--device", "cpu", "--dataset", "digits"])
elif command == "bench":
    from workload.bench.cli import main; main(["train", "--device", "cpu"])
elif command == "doctor":
    from workload.doctor import main; main(["--device", "cpu"])
elif command == "setup":
    from workload.launch import setup; setup()
print("no choice")
"""


@pytest.mark.parametrize("command", ["train", "bench", "doctor", "setup"])
def test_every_start_chooses_before_torch_is_imported(command, tmp_path):
    done = subprocess.run([sys.executable, "-c", CHOICE_PROBE, command], cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True,
                          text=True, timeout=60)
    assert done.stdout.split() == ["False", "False"], done.stdout + done.stderr


@pytest.mark.parametrize("command", [["train", "--dataset", "digits", "--device", "cpu",
                                      "--output-dir", "run"],
                                     ["bench", "input", "--device", "cpu"]])
def test_an_inductor_cache_folder_torch_cannot_make_is_one_line_and_status_2(command,
                                                                             tmp_path):
    """T2 (issue 59): torch makes TORCHINDUCTOR_CACHE_DIR when torchvision is imported; one
    of the user's that cannot be made was warned about, then every train ended in a
    NotADirectoryError traceback. Refused before any work now (predict and evaluate too)."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(blocker / "inductor"),
           "TMPDIR": str(shared_tmp(tmp_path))}
    done = subprocess.run([str(Path(sys.executable).with_name(command[0])), *command[1:]],
                          capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert done.stderr == (f"{command[0]}: error: TORCHINDUCTOR_CACHE_DIR={blocker}/inductor "
                           f"is not writable ({blocker}/inductor: Not a directory): set it to "
                           "a folder you can write, or unset it to let hpc-train use a "
                           "node-local one\n")
    assert not (tmp_path / "run").exists()
