"""`doctor` on a GPU (device facts, the driver check, NCCL's version); `train` started by
torchrun as one rank on the GPU; a two-process NCCL group on one GPU, where NCCL allows it."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from tests.helpers import DOCTOR_FAST, TESTS, TINY, by_check, clean_env

pytestmark = pytest.mark.gpu

NCCL_PAIR = TESTS / "helpers" / "nccl_pair.py"


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


@pytest.mark.parametrize("ranks", [1, 2])
def test_an_nccl_group_all_reduces_on_one_gpu(cuda, ranks):
    # Both ranks on GPU 0: NCCL refuses duplicate GPUs in one communicator in most
    # releases ("Duplicate GPU detected"); the test then says so instead of failing.
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           f"--nproc-per-node={ranks}", str(NCCL_PAIR)], capture_output=True,
                          text=True, env=dict(clean_env(), NCCL_DEBUG="WARN"), timeout=240)
    output = done.stdout + done.stderr
    refusal = [line for line in output.splitlines() if "duplicate gpu" in line.lower()]
    if done.returncode != 0 and ranks > 1 and refusal:
        pytest.skip("NCCL refuses two ranks on one GPU: " + refusal[0].strip()[:200])
    assert done.returncode == 0, output[-3000:]
    sums = re.findall(r"nccl-sum rank (\d+) (\S+)", done.stdout)
    expected = str(float(sum(range(1, ranks + 1))))
    assert sorted(sums) == [(str(rank), expected) for rank in range(ranks)], output[-3000:]
