"""`train` on damaged run folders and path flags, run as users run it: a damaged
diagnostics folder is one warning and the training goes on; a run folder that turns
read-only mid-run, under the loop or under the background writer's save, is one line, its
checkpoints kept."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import (TINY, clean_env, ext4, started_writer_of, tmpfs, wait_for,
                           write_image_folder)
from workload.checkpoint.writer.folder import complete_steps, latest_step

pytestmark = pytest.mark.slow

QUICK = [*TINY, "--dataset", "synthetic", "--synthetic-size", "64", "--num-classes", "2",
         "--image-size", "16", "--batch-size", "32", "--epochs", "1"]


def train(*args, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "workload.train", *QUICK, *map(str, args)],
                          capture_output=True, text=True, timeout=timeout, env=clean_env())


@contextlib.contextmanager
def damaged_diagnostics(out, kind):
    """The run folder `out` with its diagnostics/ damaged in one way."""
    out.mkdir()
    folder = out / "diagnostics"
    if kind == "a file":
        folder.write_text("not a folder")
    elif kind == "a dangling link":
        folder.symlink_to(out / "nowhere")
    elif kind == "a folder named like a heartbeat":
        (folder / "heartbeat-0.json").mkdir(parents=True)
    if kind != "read-only":
        yield
        return
    with tmpfs(folder, "size=1m"):
        subprocess.run(["mount", "-o", "remount,ro", str(folder)], check=True)
        yield


@pytest.mark.root  # the read-only case mounts a tmpfs
@pytest.mark.parametrize("kind", ["a file", "a dangling link", "a folder named like a heartbeat",
                                  "read-only"])
def test_a_damaged_diagnostics_folder_is_a_warning_and_the_run_trains(kind, tmp_path):
    out = tmp_path / "run"
    with damaged_diagnostics(out, kind):
        done = train("--output-dir", out)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    assert done.stdout.count("no heartbeats or stall dumps for this run") == 1, done.stdout
    assert json.loads((out / "summary.json").read_text())["epochs_run"] == 1


@contextlib.contextmanager
def long_run_on_ext4(tmp_path: Path, *args: str):
    """`train` running into a run folder on an ext4 file system mounted errors=remount-ro,
    which turns itself read-only on an error (the kernel's trigger_fs_error makes one),
    files open for writing or not: the job, the file system and the job's log."""
    log = tmp_path / "log.txt"
    with ext4(tmp_path / "fs", tmp_path / "fs.img", "errors=remount-ro") as fs:
        with open(log, "w") as stream:
            job = subprocess.Popen([sys.executable, "-m", "workload.train", *QUICK,
                                    "--synthetic-size", "4096", "--epochs", "50", *args,
                                    "--output-dir", str(fs / "run")],
                                   stdout=stream, stderr=subprocess.STDOUT, env=clean_env())
        try:
            yield job, fs, log
        finally:
            if job.poll() is None:
                job.kill()
                job.wait()


def turn_read_only(fs: Path) -> None:
    device = Path(subprocess.run(["findmnt", "-no", "SOURCE", str(fs)], check=True,
                                 capture_output=True, text=True).stdout.strip())
    Path(f"/sys/fs/ext4/{device.name}/trigger_fs_error").write_text("1")


def assert_read_only_line_and_kept(status: int, fs: Path, log: Path, kept: int) -> None:
    """The run's end: one line, exit status 2, the newest committed checkpoint `kept` (on
    the file system, still mounted)."""
    text = log.read_text()
    assert status == 2 and "Traceback" not in text, text[-3000:]
    assert f"the file system turned read-only under {fs / 'run'}" in text, text[-3000:]
    assert "make it writable again" in text, text[-3000:]
    root = fs / "run" / "checkpoints"
    assert latest_step(root) == kept and complete_steps(root)[-1][0] == kept


@pytest.mark.root  # mounts an ext4 file system
def test_a_run_folder_turned_read_only_is_one_line_and_keeps_its_checkpoint(tmp_path):
    """The loop's next write (steps.jsonl, --log-every 1) fails with EROFS."""
    with long_run_on_ext4(tmp_path, "--log-every", "1", "--checkpoint-every", "0") as (
            job, fs, log):
        root = fs / "run" / "checkpoints"
        wait_for(lambda: latest_step(root) is not None, "the first checkpoint", log, 240)
        kept = latest_step(root)
        turn_read_only(fs)
        assert_read_only_line_and_kept(job.wait(timeout=120), fs, log, kept)


def stopped_holding_a_save(writer: int, root: Path) -> bool:
    """Stop the writer; whether it holds a save not yet committed then (its temporary
    folder is there), else it goes on."""
    os.kill(writer, signal.SIGSTOP)
    if list(root.glob(".tmp-step-*")):
        return True
    os.kill(writer, signal.SIGCONT)
    return False


@pytest.mark.root  # mounts an ext4 file system
def test_a_run_folder_turned_read_only_while_the_writer_saves_is_one_line(tmp_path):
    """The background writer (the default asynchronous save) meets the read-only folder:
    stopped while it holds a save, the folder turned read-only, then let go on."""
    with long_run_on_ext4(tmp_path, "--checkpoint-every", "2") as (job, fs, log):
        root = fs / "run" / "checkpoints"
        wait_for(lambda: latest_step(root) is not None, "the first checkpoint", log, 240)
        writer = started_writer_of(job.pid)
        wait_for(lambda: stopped_holding_a_save(writer, root), "a save in flight", log, 60,
                 poll=0.01)
        kept = latest_step(root)
        turn_read_only(fs)
        os.kill(writer, signal.SIGCONT)
        assert_read_only_line_and_kept(job.wait(timeout=120), fs, log, kept)


def waits_for_its_disk(pid: int) -> bool:
    """Whether a thread of process `pid` is in state D (uninterruptible: the disk's)."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            if (task / "stat").read_text().rsplit(")", 1)[1].split()[0] == "D":
                return True
    return False


@pytest.mark.root  # mounts and freezes an ext4 file system
def test_a_writer_waiting_for_a_stalled_disk_is_waited_for_after_a_preemption(tmp_path):
    """The run folder's file system stalls for 14 s (fsfreeze) while the writer holds a
    save, and SIGTERM comes meanwhile: the writer, in state D, is waited for, its save
    commits once the file system answers, and the run ends with 75 and its preemption
    checkpoint. A writer stopped instead is left at once: test_checkpoint_own_loop.py."""
    with long_run_on_ext4(tmp_path, "--checkpoint-every", "1", "--stall-timeout", "0") as (
            job, fs, log):
        root = fs / "run" / "checkpoints"
        wait_for(lambda: latest_step(root) is not None, "the first checkpoint", log, 240)
        writer = started_writer_of(job.pid)
        wait_for(lambda: stopped_holding_a_save(writer, root), "a save in flight", log, 60,
                 poll=0.01)
        [held] = root.glob(".tmp-step-*")
        subprocess.run(["fsfreeze", "-f", str(fs)], check=True)
        os.kill(writer, signal.SIGCONT)
        wait_for(lambda: waits_for_its_disk(writer), "the writer to wait for its disk", log, 30,
                 poll=0.01)
        job.send_signal(signal.SIGTERM)
        time.sleep(14)
        subprocess.run(["fsfreeze", "-u", str(fs)], check=True)
        status = job.wait(timeout=120)
        text = log.read_text()
        assert status == 75 and "Traceback" not in text, text[-3000:]
        assert f"SIGTERM while the checkpoint writer (PID {writer}, state D: waiting for a " \
            "disk (uninterruptible)) holds the save of step" in text, text[-3000:]
        assert "waiting up to 60 s for it to commit" in text, text[-3000:]
        assert "held the save of step" not in text, text[-3000:]  # the abandoning line
        step = int(held.name.removeprefix(".tmp-step-"))
        assert latest_step(root) >= step and not list(root.glob(".tmp-step-*")), text[-3000:]


def test_an_image_that_decodes_too_large_is_skipped_by_the_training(tmp_path):
    """The training reads image files through the same bound as predict: a 64 Mpixel PNG
    in the data is a skipped file with a warning, not a worker ended by memory."""
    from PIL import Image

    data = write_image_folder(tmp_path / "pets", per_class=2)
    Image.new("1", (8000, 8000)).save(data / "train" / "cat" / "bomb.png")
    done = subprocess.run([sys.executable, "-m", "workload.train", *TINY, "--dataset",
                           "imagefolder", "--data-dir", str(data), "--image-size", "16",
                           "--batch-size", "5", "--epochs", "1", "--workers", "0",
                           "--output-dir", str(tmp_path / "run")],
                          capture_output=True, text=True, timeout=300, env=clean_env())
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "bomb.png: it cannot be read as an image (8000 x 8000 pixels" in done.stdout


# A program that calls train in its own process: what it had set before, and afterwards
# the same read again (printed as JSON), then SIGUSR1 sent to itself.
IN_PROCESS = """
import json, logging, os, signal, sys
import torch
from workload.train import main

torch.set_num_threads(2)
torch.backends.cudnn.allow_tf32 = True
torch.manual_seed(7)
def settings():
    log = logging.getLogger("workload")
    return dict(threads=torch.get_num_threads(), tf32=torch.backends.cudnn.allow_tf32,
                benchmark=torch.backends.cudnn.benchmark, rng=torch.rand(1).item(),
                handlers=len(log.handlers), propagate=log.propagate, level=log.level,
                files=len(os.listdir("/proc/self/fd")))
state = torch.random.get_rng_state()
before = settings()
torch.random.set_rng_state(state)
try:
    main(sys.argv[1:])
except SystemExit as stop:
    print("exit", stop.code)
print(json.dumps(dict(before=before, after=settings())))
sys.stdout.flush()
os.kill(os.getpid(), signal.SIGUSR1)  # the default: the process ends
"""


def in_program(out: Path, *args: str) -> dict:
    """IN_PROCESS with QUICK ARGS into `out`: what it had set before and after, and how
    main ended."""
    done = subprocess.run([sys.executable, "-c", IN_PROCESS, *QUICK, "--output-dir", str(out),
                           *args], capture_output=True, text=True, timeout=300,
                          env={**clean_env(), "OMP_NUM_THREADS": "1"})
    assert done.returncode == -signal.SIGUSR1, done.stdout[-2000:] + done.stderr[-2000:]
    lines = done.stdout.strip().splitlines()
    ended = [line for line in lines if line.startswith("exit ")]
    return dict(json.loads(lines[-1]), exit=ended[0] if ended else None)


@pytest.fixture(scope="module")
def program_run(tmp_path_factory) -> tuple[Path, dict]:
    """A program that trained a run in its own process: the run folder and what it read.
    The refused case starts on this run's checkpoints (another run's, to a wider model),
    not on a `train` of its own: one torch process (about 7 CPU-s) fewer."""
    out = tmp_path_factory.mktemp("program") / "run"
    return out, in_program(out)


@pytest.mark.parametrize("outcome", ["trained", "refused"])
def test_train_in_a_program_leaves_its_process_settings_as_they_were(outcome, program_run):
    out, settings = program_run
    if outcome == "refused":  # another run's checkpoints: exit 2 after the process started
        settings = in_program(out, "--width", "16")
    assert settings["exit"] == ("exit 2" if outcome == "refused" else None), settings
    assert settings["after"] == settings["before"], settings
    assert "Current thread" not in (out / "diagnostics" / "rank-0.txt").read_text()


def fifo(path):
    os.mkfifo(path)
    return path


def dangling(path):
    path.symlink_to(path.parent / "nowhere")
    return path


def a_file(path):
    path.write_text("x")
    return path


def finished_run(tmp_path):
    run = tmp_path / "finished"
    run.mkdir()
    (run / "metrics.jsonl").write_text(json.dumps(
        {"epoch": 1, "train_loss": 1.5, "test_loss": 1.4, "accuracy": 0.4,
         "images_per_second": 900.0}) + "\n")
    return run


# name: (the command line, built in tmp_path; words of its one error line). Each hung (a
# FIFO read), said "File exists" of a file or a dangling link, or blamed the network.
PATH_FLAGS = {
    "train --config a FIFO": (lambda p: ["train", *QUICK, "--config", fifo(p / "c.json")],
                              ["--config", "is not a regular file"]),
    "report, a bench file that is a FIFO": (
        lambda p: ["report", finished_run(p), fifo(p / "b.json"), "--out", p / "figures"],
        ["bench file", "is a FIFO, not a file"]),
    "train --download into a file": (
        lambda p: ["train", *TINY, "--dataset", "cifar100", "--download", "--data-dir",
                   a_file(p / "data"), "--output-dir", p / "run"],
        ["cannot be downloaded into --data-dir", "is a file, not a folder"]),
    "train --stage-to a file": (
        lambda p: ["train", *QUICK, "--dataset", "imagefolder",
                   "--data-dir", write_image_folder(p / "pets", per_class=1),
                   "--stage-to", a_file(p / "stage"), "--output-dir", p / "run"],
        ["--stage-to", "is a file, not a folder", "$SLURM_TMPDIR"]),
    "train --output-dir a dangling link": (
        lambda p: ["train", *QUICK, "--output-dir", dangling(p / "run")],
        ["--output-dir", "a symbolic link to", "which does not exist"]),
    "report --out a dangling link": (
        lambda p: ["report", finished_run(p), "--out", dangling(p / "figures")],
        ["--out", "a symbolic link to", "which does not exist"]),
}


@pytest.mark.parametrize("case", PATH_FLAGS)
def test_a_path_flag_naming_the_wrong_kind_of_thing_is_one_line(case, tmp_path):
    build, words = PATH_FLAGS[case]
    command, *args = build(tmp_path)
    done = subprocess.run([sys.executable, "-m", f"workload.{command}", *map(str, args)],
                          capture_output=True, text=True, timeout=120, env=clean_env())
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    errors = [line for line in done.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and "Traceback" not in done.stderr, done.stderr
    for word in words:
        assert word in errors[0], errors[0]


def test_report_on_a_run_whose_summary_is_a_fifo_draws_without_it(tmp_path):
    run = finished_run(tmp_path)
    fifo(run / "summary.json")
    done = subprocess.run([sys.executable, "-m", "workload.report", str(run)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert (run / "training.png").is_file()
