"""The NCCL match check as users meet it: `python -m workload.launch nccl` (what a site
job script runs before training) and `doctor`'s nccl line, with a stand-in libnccl bound
on LD_LIBRARY_PATH the way Olivia's module route binds one. torch is asked for real. The
passing case runs in the Olivia job script on the SLURM cluster
(tests/e2e/test_site_jobs_slurm.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.helpers import REPO

MODULES = ["--module=NCCL/2.26.6-GCCcore-14.2.0-CUDA-12.8.0",
           "--module=NCCL/99.1.0-GCCcore-14.3.0-CUDA-13.0.0"]


def bound_library(tmp_path: Path, version: str) -> Path:
    folder = tmp_path / f"NCCL-{version}" / "lib"
    folder.mkdir(parents=True)
    (folder / f"libnccl.so.{version}").write_bytes(b"stand-in")
    (folder / "libnccl.so.2").symlink_to(f"libnccl.so.{version}")
    return folder


def run(args: list[str], folder: Path, cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, LD_LIBRARY_PATH=str(folder), PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, *args], env=env, cwd=cwd, capture_output=True,
                          text=True, timeout=300)


def test_an_older_bound_libnccl_stops_with_one_line_naming_the_module(tmp_path):
    done = run(["-m", "workload.launch", "nccl", *MODULES], bound_library(tmp_path, "2.0.1"),
               tmp_path)
    assert done.returncode == 2 and done.stdout == ""
    [line] = done.stderr.splitlines()
    assert line.startswith("nccl: the bound libnccl 2.0.1 (") and "older than 2." in line
    assert line.endswith("(NCCL_MODULE=NCCL/99.1.0-GCCcore-14.3.0-CUDA-13.0.0)")


def test_doctor_reports_both_versions(tmp_path):
    report = tmp_path / "doctor.json"
    done = run(["-m", "workload.doctor", "--device", "cpu", "--probe-mib", "0", "--json",
                str(report)], bound_library(tmp_path, "2.0.1"), tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    [finding] = [f for f in json.loads(report.read_text())["findings"] if f["check"] == "nccl"]
    assert finding["status"] == "warn" and "bound 2.0.1" in finding["detail"]
    assert "torch.cuda.nccl.version() 2." in finding["detail"]
    assert "the image's own 2." in finding["detail"]
