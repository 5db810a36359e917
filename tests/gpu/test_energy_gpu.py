"""The real NVML energy counter of a GPU over a few training steps: `train` on the GPU
reports a positive energy with its source, and the mean power of the run lies between 0
and the board's power limit (docs/energy.md)."""

from __future__ import annotations


import pytest

from tests.helpers import DIGITS_RUN, run_train, read_jsonl

pytestmark = pytest.mark.gpu


def power_limit_w() -> float:
    import pynvml
    import torch

    from workload.training.energy import gpu_handle

    pynvml.nvmlInit()
    try:
        handle = gpu_handle(pynvml, torch.device("cuda", 0))
        return pynvml.nvmlDeviceGetEnforcedPowerLimit(handle) / 1000
    finally:
        pynvml.nvmlShutdown()


def test_a_gpu_run_reads_its_boards_energy(cuda, tmp_path):
    out = tmp_path / "run"
    summary = run_train([*DIGITS_RUN, "--device", "cuda", "--max-steps", "40",
                         "--log-every", "10"], out)
    assert summary["gpu_energy_source"] == "nvml-total-energy", summary
    assert summary["gpu_energy_j"] > 0 and summary["gpu_energy_per_step_j"] > 0
    limit = power_limit_w()
    lines = [line for line in read_jsonl(out / "steps.jsonl") if line["gpu_power_w"]]
    assert lines, "no interval carried the GPU's power"
    for line in lines:
        assert 0 < line["gpu_power_w"] <= limit * 1.05, (line, limit)  # NVML's own slack
    # The whole run's mean power (start-up to the end) is under the limit too.
    assert summary["gpu_energy_j"] / summary["total_time_s"] <= limit * 1.05
