"""The ``slurm_cluster`` fixture: one private cluster per test session.

Use it from any test module (tests/conftest.py imports it):

    @pytest.mark.slurm
    def test_something(slurm_cluster):
        done = slurm_cluster.run(["srun", "-N2", "-n4", "hostname"])
        # or: subprocess.run([...], env=slurm_cluster.env)  (carries SLURM_CONF)

``slurm_cluster.root`` holds the config and daemon logs (shown when a test fails; in
/var/tmp, removed at the session's end);
sbatch/scancel/requeue work the same way through ``slurm_cluster.env``. Each test ends
with the queue emptied; the daemons are stopped at the end of the session.
"""

from __future__ import annotations

import pytest

from tests.helpers.users import reachable_folder
from tests.slurm.cluster import SlurmCluster


@pytest.fixture(scope="session")
def slurm_session() -> SlurmCluster:
    # With SLURM accounting: the site twins' accounts and QOS are SLURM's own. In a folder
    # every user reaches: the twins' normal user reads slurm.conf and talks to munged.
    with reachable_folder("hpc-train-slurm-") as root:
        cluster = SlurmCluster.start(root, accounting=True)
        try:
            yield cluster
        finally:
            cluster.stop()


@pytest.fixture
def slurm_cluster(slurm_session) -> SlurmCluster:
    """The session's cluster, its queue emptied after each test: a job that a failed test
    left holding a node (a step held with SIGSTOP, a time limit of minutes) would hold up
    every later test's jobs on it until they time out. A centre's partitions and
    submission rules that a site twin set end with its test too."""
    yield slurm_session
    slurm_session.cancel_jobs()
    slurm_session.reset_centre()
