"""How long a run takes to continue after a node is lost: restart inside the allocation
on a spare node against requeue, on the suite's private SLURM cluster (tests/slurm).

Each round runs the test's training (tests/e2e/test_restarts_slurm.py: jobs/requeue.sbatch,
2 ranks, a checkpoint every 4 steps) twice, on the `spares` partition with --no-kill:
with 3 nodes and SPARE_NODES=1 (the decision restarts the step on the spare), and with 2
nodes (the decision requeues the job, the lost node excluded). Once the first checkpoint
is there, the second node is lost as the test loses it; the time printed runs from then
to the first step of the continued run (train's start-up record, startup-rank-0.json).
The requeue's figure holds the cluster's credential lifetime (cred_expire=15, where a
site's default is 120 s) and no queue wait. Needs the Debian packages of the SLURM tests:

    PATH=$PWD/.venv/bin:$PATH .venv/bin/python tools/recovery_times.py /tmp/recovery 2
"""

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.e2e.test_restarts_slurm import lose_node, train_job  # noqa: E402
from tests.helpers import wait_for  # noqa: E402
from tests.slurm.cluster import SlurmCluster  # noqa: E402
from tests.slurm.jobs import stop_step, wait_until_ended  # noqa: E402

PATHS = {"restart": (["--nodes=3"], {"SPARE_NODES": "1"}), "requeue": (["--nodes=2"], {})}


def one_round(cluster: SlurmCluster, folder: Path, path: str) -> str:
    """One run of `path` that loses a node: its line (the time to the first step after)."""
    options, settings = PATHS[path]
    lost = cluster.nodes[1]
    job, run, log = train_job(cluster, folder, "--partition=spares", "--no-kill", *options,
                              **settings)
    wait_for((run / "checkpoints" / "latest").exists, "the first checkpoint", log, poll=0.05)
    stop_step(cluster, job, cluster.nodes[0])  # held, as in the test: it cannot finish first
    failed = time.time()
    lose_node(cluster, job, lost)
    try:
        state = wait_until_ended(cluster, job, log, timeout=400)
    finally:
        cluster.start_node(lost)
        cluster.back_in_service(lost)
    first = json.loads((run / "diagnostics" / "startup-rank-0.json").read_text())
    decisions = [line for line in log.read_text().splitlines() if line.startswith("decision:")]
    return (f"{path}: {state}, first step {first['at'] - failed:.1f} s after the node was "
            f"lost; {decisions[0]}")


def main() -> None:
    root, rounds = Path(sys.argv[1]), int(sys.argv[2])
    with SlurmCluster.start(root / "cluster") as cluster:
        for number in range(rounds):
            for path in PATHS:
                print(one_round(cluster, root / f"{path}-{number}", path), flush=True)


if __name__ == "__main__":
    main()
