"""Two users on one node, one temp folder, as Apptainer and Charliecloud bind the host's
/tmp: the first user's job leaves its cache folder behind, and the second user's `doctor`
is still ready, reports its own folder, and writes only there. The users are two uids
switched to with setpriv (root only), no passwd entry, a home they cannot write. And
`train` choosing before torchvision's import fixes Inductor's folder."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.helpers import DIGITS_RUN, DOCTOR_FAST, REPO, by_check, clean_env
from workload.caches import CACHE_KEYS

FIRST, SECOND = 65533, 65534



@pytest.fixture
def node_tmp():
    """A temp folder like /tmp (sticky, everyone may create), and a working folder per
    uid, where both uids can reach them (pytest's tmp_path is root's alone)."""
    top = Path(tempfile.mkdtemp(prefix="hpc-train-cache-users-", dir="/var/tmp"))
    top.chmod(0o755)
    tmp = top / "tmp"
    tmp.mkdir()
    tmp.chmod(0o1777)
    for uid in (FIRST, SECOND):
        (top / f"work-{uid}").mkdir()
        os.chown(top / f"work-{uid}", uid, uid)
    (top / "python").mkdir()
    yield top
    shutil.rmtree(top)


def as_user(uid: int, argv: list[str], top: Path) -> subprocess.CompletedProcess:
    """`python argv` as `uid`. The test's environment is bound at top/python in a mount
    namespace of the command's own: it may live where only root can read (CI's is under
    root's 0700 home), while a site's software is readable by every user."""
    env = {k: v for k, v in clean_env().items() if k not in CACHE_KEYS}  # as the image's
    env.update(TMPDIR=str(top / "tmp"), HOME="/nonexistent", USER=f"user{uid}",
               PYTHONPATH=str(REPO))
    python = top / "python" / Path(sys.executable).relative_to(sys.prefix)
    bind = 'mount --bind "$1" "$2" && shift 2 && exec "$@"'
    return subprocess.run(["unshare", "--mount", "--propagation", "private",
                           "sh", "-c", bind, "sh", sys.prefix, str(top / "python"),
                           "setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups",
                           str(python), *argv], env=env, cwd=top / f"work-{uid}",
                          capture_output=True, text=True, timeout=300)


def launch_env(uid: int, top: Path) -> dict[str, str]:
    done = as_user(uid, ["-m", "workload.launch", "env", "--command", "python"], top)
    assert done.returncode == 0, done.stderr
    return dict(line.split("=", 1) for line in done.stdout.splitlines()
                if line and not line.startswith("#"))


@pytest.mark.root  # setpriv to other uids
def test_the_second_users_doctor_is_ready_in_its_own_cache_folder(node_tmp):
    tmp = node_tmp / "tmp"
    first = launch_env(FIRST, node_tmp)  # the first user's job on the node
    assert first["TORCHINDUCTOR_CACHE_DIR"] == str(tmp / f"hpc-train-{FIRST}" / "inductor")
    assert stat.S_IMODE((tmp / f"hpc-train-{FIRST}").stat().st_mode) == 0o700

    report = node_tmp / f"work-{SECOND}" / "doctor.json"
    done = as_user(SECOND, ["-m", "workload.doctor", "--device", "cpu", "--json", str(report),
                            "--output-dir", str(node_tmp / f"work-{SECOND}"), *DOCTOR_FAST],
                   node_tmp)
    assert done.returncode == 0 and "doctor: ready" in done.stdout, done.stdout + done.stderr
    own = tmp / f"hpc-train-{SECOND}"
    caches = by_check(json.loads(report.read_text()), "cache")
    compile_caches = {f["detail"].split()[0]: f for f in caches
                      if f["detail"].startswith(("TORCHINDUCTOR", "TRITON"))}
    assert compile_caches.keys() == {"TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"}
    for finding in compile_caches.values():
        assert finding["status"] == "ok" and f" {own}/" in finding["detail"], finding
    assert stat.S_IMODE(own.stat().st_mode) == 0o700 and own.stat().st_uid == SECOND
    written = [p for p in tmp.rglob("*") if p.lstat().st_uid == SECOND]
    assert written and all(p == own or own in p.parents for p in written), written

    second = launch_env(SECOND, node_tmp)  # a script of the second user's: the same folder
    assert second["TRITON_CACHE_DIR"] == str(own / "triton")


@pytest.mark.slow  # a training of one step
def test_train_chooses_inductors_folder_before_torchvision_fixes_its_own(tmp_path):
    """torchvision's import makes Inductor's folder (torch's default
    <tmp>/torchinductor_<user> unless TORCHINDUCTOR_CACHE_DIR is set): train chooses first."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {k: v for k, v in clean_env().items() if k not in CACHE_KEYS}
    done = subprocess.run([sys.executable, "-m", "workload.train", *DIGITS_RUN, "--max-steps",
                           "1", "--output-dir", str(tmp_path / "run")], cwd=tmp_path,
                          env={**env, "TMPDIR": str(tmp), "PYTHONPATH": str(REPO)},
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert sorted(p.name for p in tmp.iterdir()) == [f"hpc-train-{os.getuid()}"]
    assert (tmp / f"hpc-train-{os.getuid()}" / "inductor").is_dir()
