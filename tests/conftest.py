"""Shared helpers: run `train` in-process and read what a run leaves behind."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.slurm.fixture import slurm_cluster  # noqa: F401  (session-scoped, see tests/slurm)
from workload.train import main as train_main

# A model small enough that a few steps take well under a second on a 2-core CPU.
TINY = ["--model", "wrn", "--width", "8", "--blocks-per-stage", "1", "--device", "cpu"]


def run_train(args: list[str], out: Path) -> dict:
    """Run `train ARGS --output-dir OUT` in this process; return its summary.json."""
    train_main([*args, "--output-dir", str(out)])
    return json.loads((out / "summary.json").read_text())


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture
def tiny_args() -> list[str]:
    return list(TINY)
