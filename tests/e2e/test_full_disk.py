"""Every command that writes where the user points it, on a disk with no room left: one
line that names the problem and its fix, exit status 2, never a traceback. A full disk,
a quota or a file system turned read-only is the user's to fix whichever command wrote
(workload.commands.run_command turns each into that line; train adds that its run resumes
from its last checkpoint, tests/e2e/test_checkpoint_local.py). The disk is a real tmpfs
filled to its last block, as a project quota leaves it; the commands run as a user runs
them, the console scripts and `python -m` as subprocesses."""

from __future__ import annotations

import contextlib
import errno
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import ext4, tmpfs
from workload.errors import write_problem

pytestmark = [pytest.mark.root, pytest.mark.slow]  # mounts a tmpfs; evaluates a trained run


@contextlib.contextmanager
def full_disk(tmp_path: Path):
    """A 256 KiB tmpfs with one file taking every block left."""
    with tmpfs(tmp_path / "full", "size=256k") as disk:
        with open(disk / "filler", "wb", buffering=0) as filler:
            try:
                while True:
                    filler.write(b"\0" * 4096)
            except OSError as error:
                assert error.errno == errno.ENOSPC
        yield disk


# Each command with the place it writes on the full disk (`disk`) and, where it needs
# one, a finished run to read (`run`).
COMMANDS = {
    "evaluate --json": lambda run, disk: ["evaluate", str(run), "--json",
                                          str(disk / "e.json")],
    "report --out": lambda run, disk: ["report", str(run), "--out", str(disk / "figures")],
    "doctor --json": lambda run, disk: ["doctor", "--device", "cpu", "--json",
                                        str(disk / "d.json")],
    "launch jobs": lambda run, disk: [sys.executable, "-m", "workload.launch", "jobs",
                                      str(disk / "jobs")],
    "bench commit": lambda run, disk: ["bench", "commit", "--size-mb", "0.1", "--rounds",
                                       "1", "--dir", str(disk)],
}


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_command_writing_on_a_full_disk_says_so_in_one_line(command, digits_run,
                                                               tmp_path):
    with full_disk(tmp_path) as disk:
        done = subprocess.run(COMMANDS[command](digits_run, disk), capture_output=True,
                              text=True, timeout=300, cwd=tmp_path)
        left = sorted(str(path.relative_to(disk)) for path in disk.rglob("*")
                      if not path.is_dir())
    err = done.stderr.strip().splitlines()
    assert done.returncode == 2, done.stderr[-3000:]
    assert len(err) == 1 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert "/proc/" not in err[0], err[0]  # the folder as the user named it
    assert str(disk) in err[0] and ("free space" in err[0] or "MB free" in err[0]), err[0]
    assert left == ["filler"], left  # no half-written file left behind (folders may be)


def test_an_io_error_on_a_file_system_turned_read_only_is_named_as_read_only(tmp_path):
    """ext4 turned read-only by an error (errors=remount-ro; the kernel's trigger_fs_error
    makes one) fails the writes then in flight with EIO and the later ones with EROFS
    (tests/e2e/test_run_inputs.py meets both), and Linux 6.x leaves its mount unmarked in
    statvfs: each is the read-only line. An EIO on a writable disk is a failing device's."""
    with ext4(tmp_path / "fs", tmp_path / "fs.img", "errors=remount-ro") as fs:
        failing = write_problem(errno.EIO, fs / "run" / "steps.jsonl")
        device = subprocess.run(["findmnt", "-no", "SOURCE", str(fs)], check=True,
                                capture_output=True, text=True).stdout.strip()
        Path(f"/sys/fs/ext4/{Path(device).name}/trigger_fs_error").write_text("1")
        in_flight = write_problem(errno.EIO, fs / "run" / "steps.jsonl")
        later = write_problem(errno.EROFS, fs / "run" / "steps.jsonl")
    assert failing.startswith(f"an input/output error on the device holding {fs}"), failing
    assert in_flight == later and later.startswith("the file system turned read-only under")
