"""`train --stage-to` as a user runs it: what it leaves, refuses and keeps, its exit
statuses, and a preemption signal in the middle of a copy."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import TINY, write_image_folder
from workload.launch.preemption import REQUEUE_EXIT_STATUS

pytestmark = pytest.mark.slow

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def train_args(data: Path, local: Path, out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "workload.train", "--dataset", "imagefolder",
            "--data-dir", str(data), "--stage-to", str(local), "--image-size", "16",
            "--workers", "0", "--output-dir", str(out), *TINY, *extra]


def train(*args, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(train_args(*args, **kwargs), capture_output=True, text=True,
                          env=ENV, timeout=600)


def stagings(local: Path) -> list[Path]:
    return sorted(p for p in local.iterdir() if p.is_dir())


def test_a_users_own_folders_are_left_alone_and_a_lookalike_is_refused(tmp_path):
    data = write_image_folder(tmp_path / "pets", per_class=2)
    local = tmp_path / "local"
    (local / "pets").mkdir(parents=True)  # the user's own folder of the data folder's name
    (local / "pets" / "results.csv").write_text("a user's results")
    done = train(data, local, tmp_path / "unused", "--prepare-data")
    assert done.returncode == 0, done.stderr
    assert (local / "pets" / "results.csv").read_text() == "a user's results"
    staged = next(p for p in stagings(local) if p.name != "pets")
    # Without its manifest the staging's folder is a stranger's: refused, left as it is.
    (local / f"{staged.name}.manifest.json").unlink()
    done = train(data, local, tmp_path / "unused", "--prepare-data")
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0, done.stderr  # one line, no traceback
    assert f"{staged} exists but was not made by --stage-to" in done.stderr
    assert "move that folder away, or pass another --stage-to folder" in done.stderr
    assert len(list(staged.rglob("*.jpg"))) == 8


@pytest.mark.parametrize("loops", [1, 2])
def test_a_link_loop_in_the_source_is_refused_before_any_copy(tmp_path, loops):
    data = write_image_folder(tmp_path / "pets", per_class=2)
    for k in range(loops):
        (data / "train" / "cat" / f"again{k}").symlink_to(data / "train")
    local = tmp_path / "local"
    done = train(data, local, tmp_path / "unused", "--prepare-data")
    assert done.returncode == 2, done.stderr[-3000:]
    assert done.stderr.strip().count("\n") == 0, done.stderr
    assert "a symbolic link loop" in done.stderr and "remove the link" in done.stderr
    assert not local.exists() or list(local.iterdir()) == []


def test_a_changed_source_is_staged_anew_beside_the_copy_a_running_job_reads(tmp_path):
    data = write_image_folder(tmp_path / "pets", per_class=2)
    local = tmp_path / "local"
    # Training on until it is stopped: no early stop at the target accuracy either, which
    # 4 images reach in a few epochs (and then the job, and its hold on the staging, end).
    running = subprocess.Popen(train_args(data, local, tmp_path / "a", "--epochs", "100000",
                                          "--patience", "100000", "--batch-size", "2"),
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               env=ENV)
    log = []
    for line in running.stdout:  # until it trains from its staging
        log.append(line)
        if "data backend" in line:
            break
    [first] = stagings(local)
    image = data / "train" / "cat" / "0.jpg"  # rewritten in place: same size, same mtime
    before = image.stat()
    image.write_bytes(image.read_bytes()[::-1])
    os.utime(image, ns=(before.st_atime_ns, before.st_mtime_ns))
    second = train(data, local, tmp_path / "unused", "--prepare-data")
    assert second.returncode == 0, second.stderr
    assert f"kept the older staging {first.name}: another job reads it" in second.stdout
    assert len(list(first.rglob("*.jpg"))) == 8 and running.poll() is None
    [new] = [p for p in stagings(local) if p != first]
    assert (new / "train" / "cat" / "0.jpg").read_bytes() == image.read_bytes()
    running.send_signal(signal.SIGTERM)
    log.extend(running.stdout)
    assert running.wait(timeout=300) == REQUEUE_EXIT_STATUS, "".join(log)[-3000:]
    third = train(data, local, tmp_path / "unused", "--prepare-data")
    assert "reusing the staging" in third.stdout
    assert f"removed the older staging {first.name}" in third.stdout
    assert stagings(local) == [new]


@pytest.fixture(scope="module")
def many_files(tmp_path_factory) -> Path:
    """A source whose copy takes a while: 20,000 small files."""
    data = tmp_path_factory.mktemp("many") / "data"
    for split in ("train", "val"):
        folder = data / split / "cat"
        folder.mkdir(parents=True)
        for i in range(10_000):
            (folder / f"{i}.jpg").write_bytes(b"x" * 100)
    return data


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGUSR2, signal.SIGINT],
                         ids=["TERM", "USR2", "INT"])
def test_a_signal_stops_a_copy_leaves_nothing_and_asks_for_the_requeue(many_files, tmp_path,
                                                                      signum):
    local = tmp_path / "local"
    proc = subprocess.Popen(train_args(many_files, local, tmp_path / "unused",
                                       "--prepare-data"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
    while not (local.is_dir() and any(".partial-" in p.name for p in local.iterdir())):
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.01)
    proc.send_signal(signum)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == REQUEUE_EXIT_STATUS, out + err
    assert f"staging stopped by {signal.Signals(signum).name}" in out + err
    assert "exiting with status 75 so the job script requeues the job" in out + err
    assert list(local.iterdir()) == []  # no partial copy, no manifest, no lock
