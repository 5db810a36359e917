"""The GPU check in its CPU form, exactly as CI runs it: `make gpu-check DEVICE=cpu
GPU_CHECK_OUT=DIR` (the quick sizes) installs the package and the carried wheels without
network, runs the GPU tier (its CUDA tests skip here), the benchmark comparison with its
MFU arithmetic and the profiler summary at tiny sizes, and writes the report whose shape
is checked here.
(`make gpu-wheels` first: it builds the carried wheels once, here, where pip can fetch.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO, clean_env

pytestmark = pytest.mark.slow

ROW_KEYS = {"model", "batch_size", "reference_images_per_second", "images_per_second",
            "ratio", "mfu"}


def make(*args: str, timeout: float) -> subprocess.CompletedProcess:
    # The Python running this suite is the one with torch: first on PATH for make.
    env = dict(clean_env(), PATH=os.pathsep.join([str(Path(sys.executable).parent),
                                                  os.environ.get("PATH", "")]))
    return subprocess.run(["make", "--no-print-directory", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def report_dir(tmp_path_factory) -> Path:
    wheels = make("gpu-wheels", timeout=300)
    assert wheels.returncode == 0, wheels.stdout[-3000:] + wheels.stderr[-3000:]
    out = tmp_path_factory.mktemp("gpu-check")
    done = make("gpu-check", "DEVICE=cpu", f"GPU_CHECK_OUT={out}", timeout=600)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-3000:]
    return out


def test_the_report_has_the_device_versions_test_counts_and_bench_rows(report_dir):
    report = json.loads((report_dir / "gpu-check.json").read_text())
    assert report["device"].startswith("cpu") and report["quick"] is True
    assert {"torch", "torchvision", "workload", "cudnn", "nccl"} <= report["versions"].keys()
    assert [report[part]["status"] for part in ("install", "tests", "bench")] == ["passed"] * 3
    tests = report["tests"]
    assert {"passed", "failed", "skipped", "seconds"} <= tests.keys()
    # Here the kit's own install check passes and every CUDA test skips, saying why.
    assert tests["failed"] == 0 and tests["passed"] >= 1 and tests["skipped"] >= 5
    assert all("CUDA is absent" in skip["reason"] for skip in tests["skips"])
    assert report["bench"]["errors"] == [] and report["bench"]["data"]["kind"] == "synthetic"
    rows = report["bench"]["rows"]
    assert [row["model"] for row in rows] == ["wrn", "resnet18"]
    for row in rows:
        assert ROW_KEYS <= row.keys()
        assert row["images_per_second"] > 0 and row["reference_images_per_second"] > 0
        assert row["ratio"] == pytest.approx(
            row["images_per_second"] / row["reference_images_per_second"])
        assert row["mfu"] is None  # no bf16 peak for a CPU


def test_the_report_says_where_a_train_step_spends_its_time(report_dir):
    profile = json.loads((report_dir / "gpu-check.json").read_text())["bench"]["profile"]
    phases = profile["phases"]
    assert list(phases) == ["data", "forward", "backward", "optimizer"]
    assert sum(p["share"] for p in phases.values()) == pytest.approx(1.0)
    assert phases["forward"]["ms"] > 0 and phases["backward"]["ms"] > 0
    assert profile["top"] and profile["host_syncs"]["total"] >= 0
    markdown = (report_dir / "gpu-check.md").read_text()
    for words in ("## Tests (`pytest -m gpu tests/gpu`): passed", "| wrn |", "| resnet18 |",
                  "| backward |", "top operators", "CIFAR-100-shaped"):
        assert words in markdown

