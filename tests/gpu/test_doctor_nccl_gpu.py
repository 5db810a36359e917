"""`doctor` on a GPU (device facts, the driver check, NCCL's version); `train` started by
torchrun as one rank on the GPU; NCCL groups of one process, and of two where two GPUs are
visible (NCCL refuses two ranks on one GPU: there the two-rank test is left out)."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from tests.helpers import DOCTOR_FAST, TESTS, TINY, by_check, clean_env

pytestmark = pytest.mark.gpu

NCCL_PAIR = TESTS / "scripts" / "nccl_pair.py"


def test_doctor_on_a_gpu_reports_the_device_the_driver_and_nccl(cuda, tmp_path):
    report = tmp_path / "doctor.json"
    done = subprocess.run(["doctor", "--device", "cuda", *DOCTOR_FAST, "--json", str(report),
                           "--output-dir", str(tmp_path / "runs")], capture_output=True,
                          text=True, env=clean_env(), cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    data = json.loads(report.read_text())
    gpu, = by_check(data, "gpu")
    matmul, = by_check(data, "matmul")
    assert gpu["status"] == "ok" and matmul["status"] == "ok", (gpu, matmul)
    assert by_check(data, "driver"), "no driver finding on a GPU node"
    assert all(f["status"] != "fail" for f in by_check(data, "driver"))
    assert re.fullmatch(r"\d+\.\d+\.\d+", data["versions"][0]["nccl"])
    assert data["ranks"][0]["device"].startswith("cuda")
    # NVML read this rank's GPU: plausible clocks and temperature, a verdict naming them.
    reading, = data["gpus"]
    assert isinstance(reading, dict), f"NVML checks did not run: {reading}"
    assert 100 <= reading["sm_clock_max_mhz"] <= 5000
    assert 0 < reading["sm_clock_mhz"] <= reading["sm_clock_max_mhz"]
    assert 5 <= reading["temperature_c"] <= 110
    assert reading["slowdown_c"] is None or 60 <= reading["slowdown_c"] <= 120
    health = by_check(data, "gpu-health")
    assert health and all(f["status"] != "info" for f in health), health
    assert "gpu-health" in done.stdout and "MHz" in done.stdout


def test_torchrun_starts_train_as_one_rank_on_the_gpu(cuda, tmp_path):
    out = tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc-per-node=1", "-m", "workload.train", *TINY, "--device",
                           "cuda", "--dataset", "synthetic", "--synthetic-size", "128",
                           "--num-classes", "4", "--batch-size", "32", "--epochs", "1",
                           "--output-dir", str(out)],
                          capture_output=True, text=True, env=clean_env(), timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["world_size"] == 1 and summary["device"].startswith("cuda")


def nccl_sums(ranks: int) -> None:
    """NCCL_PAIR under torchrun with `ranks` processes, one GPU each; each prints the sum."""
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           f"--nproc-per-node={ranks}", str(NCCL_PAIR)], capture_output=True,
                          text=True, env=dict(clean_env(), NCCL_DEBUG="WARN"), timeout=240)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-3000:]
    sums = re.findall(r"nccl-sum rank (\d+) (\S+)", done.stdout)
    expected = str(float(sum(range(1, ranks + 1))))
    assert sorted(sums) == [(str(rank), expected) for rank in range(ranks)], output[-3000:]


def test_an_nccl_group_of_one_rank_all_reduces(cuda):
    nccl_sums(1)


def test_an_nccl_group_of_two_ranks_all_reduces_across_two_gpus(two_gpus):
    nccl_sums(2)
