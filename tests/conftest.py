"""Fixtures every test may use. Shared functions and constants live in tests/helpers."""

from __future__ import annotations

import pytest

from tests.helpers import TINY
from tests.slurm.fixture import slurm_cluster  # noqa: F401  (session-scoped, see tests/slurm)


@pytest.fixture
def tiny_args() -> list[str]:
    return list(TINY)
