"""The GPU tier: `pytest -m gpu tests/gpu`, what `make gpu-check` runs. Every test that
needs CUDA asks for the `cuda` fixture and is skipped, with the reason, where CUDA is
absent (CI's CPU run of the kit); a test that needs two GPUs asks for `two_gpus` and is
left out where fewer are visible. The rest run everywhere."""

from __future__ import annotations

import os

import pytest

from tests.helpers.gpus import fewer_gpus_than


@pytest.fixture
def cuda():
    """The first GPU; skips the test where CUDA is absent."""
    import torch

    if why := fewer_gpus_than(1):
        pytest.skip(why)
    return torch.device("cuda", 0)


@pytest.fixture
def two_gpus():
    """GPUs 0 and 1; leaves the test out (a skip naming why) where fewer are visible."""
    import torch

    if why := fewer_gpus_than(2):
        pytest.skip(why)
    return torch.device("cuda", 0), torch.device("cuda", 1)


@pytest.fixture
def under_kit() -> str:
    """The device `make gpu-check` was asked for; skips outside the kit (a plain pytest
    run has not installed the package the kit's way)."""
    device = os.environ.get("GPU_CHECK_DEVICE")
    if not device:
        pytest.skip("runs under make gpu-check only (GPU_CHECK_DEVICE is unset)")
    return device
