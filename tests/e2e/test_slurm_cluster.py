"""The private SLURM cluster fixture itself: it runs real steps and cleans up after itself."""

from __future__ import annotations

import os

import pytest

from tests.slurm.cluster import SlurmCluster

pytestmark = pytest.mark.slurm


def alive(pid_file) -> bool:
    try:
        os.kill(int(pid_file.read_text().split()[0]), 0)
        return True
    except (OSError, ValueError):
        return False


def test_two_nodes_run_a_step_with_real_slurm_variables(slurm_cluster):
    done = slurm_cluster.run(["srun", "-N2", "-n4", "--kill-on-bad-exit=1", "bash", "-c",
                              "echo $SLURMD_NODENAME $SLURM_PROCID $SLURM_STEP_NODELIST"])
    assert done.returncode == 0, done.stderr
    lines = sorted(done.stdout.splitlines(), key=lambda line: int(line.split()[1]))
    assert lines == ["nid001 0 nid[001-002]", "nid001 1 nid[001-002]",
                     "nid002 2 nid[001-002]", "nid002 3 nid[001-002]"]


def test_a_second_cluster_runs_beside_and_stops_cleanly(slurm_cluster, tmp_path):
    # Another helper or CI run may start its own cluster on the same machine.
    with SlurmCluster.start(tmp_path / "second") as second:
        assert second.conf.read_text() != slurm_cluster.conf.read_text()
        done = second.run(["srun", "-N2", "-n2", "true"])
        assert done.returncode == 0, done.stderr
        pid_files = list(second._pid_files)
        assert all(alive(p) for p in pid_files)
    assert not any(alive(p) for p in pid_files)
    # The session cluster is untouched.
    assert slurm_cluster.run(["srun", "-n1", "true"]).returncode == 0
