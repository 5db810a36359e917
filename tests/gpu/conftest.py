"""The GPU tier: `pytest -m gpu tests/gpu`, what `make gpu-check` runs. Every test that
needs CUDA asks for the `cuda` fixture and is skipped, with the reason, where CUDA is
absent (CI's CPU run of the kit); the rest run everywhere."""

from __future__ import annotations

import os

import pytest


@pytest.fixture
def cuda():
    """The first GPU; skips the test where CUDA is absent."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("CUDA is absent (torch.cuda.is_available() is False)")
    return torch.device("cuda", 0)


@pytest.fixture
def under_kit() -> str:
    """The device `make gpu-check` was asked for; skips outside the kit (a plain pytest
    run has not installed the package the kit's way)."""
    device = os.environ.get("GPU_CHECK_DEVICE")
    if not device:
        pytest.skip("runs under make gpu-check only (GPU_CHECK_DEVICE is unset)")
    return device
