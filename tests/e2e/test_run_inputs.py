"""`train` on damaged run folders and path flags, run as users run it: a damaged
diagnostics folder is one warning and the training goes on."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys

import pytest

from tests.helpers import TINY, clean_env, tmpfs, write_image_folder

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
