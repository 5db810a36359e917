"""Odd and hostile values for `python -m workload.launch jobs|env|nccl`, run as users run
them: one line naming the value and the fix, exit status 2, never a traceback, and no
file written where it does not belong."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.helpers import REPO, clean_env


def launch(*args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "workload.launch", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=120,
                          env={**clean_env(), "PYTHONPATH": str(REPO), **env})


def refused(done: subprocess.CompletedProcess, *words: str) -> str:
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and all(word in lines[0] for word in words), done.stderr
    assert len(lines[0]) < 600
    return lines[0]


def test_jobs_into_a_file_or_below_one_is_one_line(tmp_path):
    (tmp_path / "afile").touch()
    refused(launch("jobs", "afile", cwd=tmp_path), "DEST='afile'", "File exists")
    refused(launch("jobs", "afile/sub", cwd=tmp_path), "DEST='afile/sub'", "Not a directory")


def test_jobs_with_an_empty_dest_copies_nothing_into_the_working_folder(tmp_path):
    refused(launch("jobs", "", cwd=tmp_path), "DEST=''", "name one")
    assert list(tmp_path.iterdir()) == []


def test_a_jobs_override_that_is_not_a_jobs_folder_is_named(tmp_path):
    """Set, HPC_TRAIN_JOBS is meant: another folder is not copied in its place."""
    refused(launch("jobs", "out", cwd=tmp_path, HPC_TRAIN_JOBS=str(tmp_path / "nope")),
            "HPC_TRAIN_JOBS=", "lib/launch.sh")
    assert not (tmp_path / "out").exists()


def test_jobs_never_writes_through_a_link_in_dest(tmp_path):
    """A link planted in DEST (a shared folder) is a clash, and --force replaces it."""
    dest, victim = tmp_path / "jobs", tmp_path / "elsewhere" / "victim"
    dest.mkdir()
    victim.parent.mkdir()
    (dest / "multinode.sbatch").symlink_to(victim)  # dangling: exists() is False
    refused(launch("jobs", str(dest), cwd=tmp_path), "multinode.sbatch", "--force")
    assert not victim.exists()
    done = launch("jobs", str(dest), "--force", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert not victim.exists() and not (dest / "multinode.sbatch").is_symlink()


def test_env_in_a_deleted_working_folder_still_prints_the_variables(tmp_path):
    """entrypoint.sh runs `env` first: a folder deleted under a job's feet loses the
    flight recorder's dumps, with a warning, not the launch."""
    gone = tmp_path / "gone"
    gone.mkdir()
    script = (f"cd {gone} && rmdir {gone} && exec {sys.executable} -m workload.launch env")
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=120,
                          env={**clean_env(), "PYTHONPATH": str(REPO)})
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert "WORLD_SIZE=1" in done.stdout
    assert "no flight recorder dumps" in done.stderr


def test_nccl_needs_a_version_of_bounded_digits(tmp_path):
    done = launch("nccl", "--needs", "9" * 5000 + ".1.1", cwd=tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    usage, error = done.stderr.strip().splitlines()  # argparse's usage, then the error
    assert "expected X.Y.Z" in error and len(error) < 200, error
