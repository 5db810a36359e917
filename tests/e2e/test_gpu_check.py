"""The GPU check in its CPU form, exactly as CI runs it: `make gpu-check DEVICE=cpu
GPU_CHECK_OUT=DIR` (the quick sizes) installs the package and the carried wheels without
network, runs the GPU tier (its CUDA tests skip here), the benchmark's rows (one per model
and speed lever: the compiled ones but the Wide ResNet's whole step, `compile-step`, say
why they do not run here) with their MFU
arithmetic, the first step taken apart (train started cold and warm), the profiler
summary at tiny sizes, and writes the report whose shape is checked here.
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

ROW_KEYS = {"model", "config", "batch_size", "status", "reason", "images_per_second", "ratio",
            "mfu", "precision", "energy_j_per_image", "energy_note", "compile_s",
            "peak_step_memory_gib"}
CONFIGS = ["reference", "defaults", "compile", "cudagraphs", "compile-blocks", "compile-step",
           "cudagraphs-step", "max-autotune"]
MEASURED_ON_THE_CPU = {(model, config) for model in ("wrn", "resnet18")
                       for config in ("reference", "defaults")} | {("wrn", "compile-step")}

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
    # Side by side per model; max-autotune (the least known compile time) last, apart.
    assert [(r["model"], r["config"]) for r in rows] == [
        (model, config) for model in ("wrn", "resnet18") for config in CONFIGS[:-1]] + [
        ("wrn", "max-autotune"), ("resnet18", "max-autotune")]
    assert report["bench"]["parts_done"] == report["bench"]["parts"]
    for row in rows:
        if (row["model"], row["config"]) in MEASURED_ON_THE_CPU:
            assert ROW_KEYS <= row.keys() and row["status"] == "measured", row
            assert row["images_per_second"] > 0 and row["reason"] is None
            assert row["mfu"] is None  # no bf16 peak for a CPU
            # No GPU board counter here: no J/image, and the reason why.
            assert row["energy_j_per_image"] is None and "CPU" in row["energy_note"]
        else:  # the compiled rows say why they do not run in the CPU form
            assert row["status"] == "not run" and "images_per_second" not in row, row
            words = "CUDA graphs need a GPU" if row["config"].startswith("cudagraphs") \
                else "not run in the CPU form"
            assert words in row["reason"], row
    # The Wide ResNet's whole step compiled (its loss and the optimizer step) runs here.
    step = next(r for r in rows if (r["model"], r["config"]) == ("wrn", "compile-step"))
    assert step["compile_mode"] == "default" and step["compile_scope"] == "step", step
    assert step["compile_s"] is not None
    for model in ("wrn", "resnet18"):
        mine = {r["config"]: r for r in rows if r["model"] == model and
                r["status"] == "measured"}
        reference, defaults = mine["reference"], mine["defaults"]
        assert defaults["ratio"] == pytest.approx(
            defaults["images_per_second"] / reference["images_per_second"])
        chosen = report["bench"]["choice"][model]
        assert chosen["config"] in {"defaults", "compile-step"} & set(mine), chosen
        assert "the fastest measured" in chosen["why"]


def test_the_report_takes_the_first_step_apart_cold_warm_and_under_cudnn_settings(report_dir):
    """train started cold and warm as new processes, its start-up phases with cuDNN's
    autotuning among them; the cuDNN variants say they do not apply on the CPU."""
    part = json.loads((report_dir / "gpu-check.json").read_text())["bench"]["first_step"]
    starts = {start["name"]: start for start in part["starts"]}
    assert list(starts) == ["cold", "warm", "benchmark", "benchmark-limit-1",
                            "benchmark-limit-0"]
    for name in ("cold", "warm"):
        start = starts[name]
        assert start["status"] == "measured", start
        assert list(start["phases_s"]) == ["imports", "process group", "data", "model",
                                           "resume", "cudnn autotune", "first step"]
        assert sum(start["phases_s"].values()) == pytest.approx(start["to_first_step_s"])
        assert start["images_per_second"] > 0
    for name in ("benchmark", "benchmark-limit-1", "benchmark-limit-0"):
        assert starts[name]["status"] == "not run"
        assert "does not apply on the CPU" in starts[name]["reason"]
    markdown = (report_dir / "gpu-check.md").read_text()
    assert "### The first step, taken apart" in markdown and "| cudnn autotune |" in markdown
    assert "| warm | " in markdown

def test_the_report_says_where_a_train_step_spends_its_time(report_dir):
    profile = json.loads((report_dir / "gpu-check.json").read_text())["bench"]["profile"]
    phases = profile["phases"]
    assert list(phases) == ["data", "forward", "backward", "optimizer"]
    assert sum(p["share"] for p in phases.values()) == pytest.approx(1.0)
    assert phases["forward"]["ms"] > 0 and phases["backward"]["ms"] > 0
    assert profile["top"] and profile["host_syncs"]["total"] >= 0
    markdown = (report_dir / "gpu-check.md").read_text()
    # Which row is the fastest here (defaults or the whole step compiled) is the CPU's.
    chosen = json.loads((report_dir / "gpu-check.json").read_text())["bench"]["choice"]
    for words in ("## Tests (`pytest -m gpu tests/gpu`): passed", "| wrn | defaults |",
                  "| resnet18 | cudagraphs | not run: CUDA graphs need a GPU",
                  f"bench would choose for wrn: {chosen['wrn']['config']}", "| backward |",
                  "top operators", "CIFAR-100-shaped"):
        assert words in markdown

