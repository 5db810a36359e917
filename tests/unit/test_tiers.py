"""The tiers' guard (tests/helpers/tiers.py): a test without a marker cannot start what the
marker declares, in its own process or in a Python process it starts."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.helpers import REPO, tiers
from tests.helpers.tier_guard.sitecustomize import UnmarkedHeavyWork

GLOO_GROUP = ("import torch.distributed as dist; dist.init_process_group('gloo', "
              "init_method='tcp://127.0.0.1:0', rank=0, world_size=1)")


def test_a_program_of_a_marker_is_refused_without_it(tmp_path):
    with tiers.Guard(set(), tmp_path / "report") as guard:
        for program in ("torchrun", "/usr/bin/srun", "podman", "mount"):
            with pytest.raises(UnmarkedHeavyWork, match="marker"):
                subprocess.run([program, "--version"])
    assert [line.split()[0] for line in guard.problems()] == [
        "torchrun", "srun", "podman", "mount"]
    assert "'root' marker" in guard.problems()[-1]


def test_a_process_group_in_a_child_python_is_reported(tmp_path):
    with tiers.Guard(set(), tmp_path / "report") as guard:
        child = subprocess.run([sys.executable, "-c", GLOO_GROUP], capture_output=True,
                               text=True)
    assert child.returncode != 0 and "mark it slow" in child.stderr
    assert len(guard.problems()) == 1 and "a torch process group" in guard.problems()[0]


def test_a_training_in_this_process_is_refused(tmp_path):
    from workload.training.trainer import Trainer

    with tiers.Guard(set(), tmp_path / "report") as guard:
        with pytest.raises(UnmarkedHeavyWork, match="started a training"):
            Trainer.fit(None)
    assert len(guard.problems()) == 1


@pytest.mark.slow  # it starts a process group, as it should
def test_the_marker_allows_it(tmp_path):
    with tiers.Guard({"slow"}, tmp_path / "report") as guard:
        child = subprocess.run([sys.executable, "-c", GLOO_GROUP + "; print('ok')"],
                               capture_output=True, text=True, timeout=120)
    assert child.returncode == 0 and child.stdout.strip() == "ok", child.stderr
    assert guard.problems() == []


def test_make_check_leaves_out_every_heavy_marker_and_pytest_knows_them(pytestconfig):
    makefile = (REPO / "Makefile").read_text()
    assert f"FAST_TIER := {tiers.FAST_TIER}\n" in makefile
    declared = {line.split(":")[0] for line in pytestconfig.getini("markers")}
    assert set(tiers.HEAVY_MARKERS) <= declared
