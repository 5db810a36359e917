"""Fixtures every test may use. Shared functions and constants live in tests/helpers."""

from __future__ import annotations

import pytest

from tests.helpers import TINY
from tests.helpers.images import build
from tests.helpers.registry import local_registry
from tests.slurm.fixture import slurm_cluster  # noqa: F401  (session-scoped, see tests/slurm)


@pytest.fixture
def tiny_args() -> list[str]:
    return list(TINY)


# The image tests' builds, shared by every module that needs them (building the NGC
# stand-in image or the emulated arm64 one twice would cost minutes).
@pytest.fixture(scope="session")
def image():
    """The Dockerfile built on the NGC stand-in base (amd64)."""
    yield from build("ngc")


@pytest.fixture(scope="session")
def arm64_image():
    """The Dockerfile built for linux/arm64 on the arm64 stand-in, under QEMU emulation."""
    yield from build("arm64", "CUDA_ARCH=9.0", arch="arm64")


@pytest.fixture(scope="session")
def registry(tmp_path_factory):
    """A local OCI registry with cached storage, a signing key and a policy requiring it
    (tests/helpers/registry.py); stopped at the end of the session."""
    with local_registry(tmp_path_factory.mktemp("registry")) as started:
        yield started
