"""Training on the private SLURM cluster in both layouts, 2 nodes x 2 processes, gloo.

Per-task layout: `srun -N2 -n4 entrypoint.sh train ...`, and jobs/multinode.sbatch's
`srun ... train` without the entrypoint (as `apptainer exec image train` runs it). Node
layout: jobs/multinode.sbatch's `srun -N2 --ntasks-per-node=1 entrypoint.sh torchrun
--nproc-per-node=2 --no-python train`. The launch layer resolves everything from the
variables SLURM really set.

The job script's two runs are the evidence for the bare per-task form and the torchrun
layout as well: a plain `srun` of the same commands beside them started 10 more torch
processes (about 60 CPU-seconds on the 2-core test machine) and proved nothing more.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import DOCTOR_FAST, REPO, by_check
from tests.slurm.jobs import sbatch, wait_until_ended

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

ENTRYPOINT = str(REPO / "entrypoint.sh")
# Tiny but real training: every rank takes a few steps and the test set is evaluated.
TINY = ["--dataset", "digits", "--device", "cpu", "--model", "wrn", "--width", "8",
        "--blocks-per-stage", "1", "--image-size", "16", "--batch-size", "16",
        "--epochs", "1", "--max-steps", "4", "--dist-timeout", "120"]
SRUN = ["srun", "--kill-on-bad-exit=1", "--time=10"]


def summary_of(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def check_done_summary(summary: dict, layout: str) -> None:
    assert (summary["world_size"], summary["layout"], summary["num_nodes"]) == (4, layout, 2)
    assert summary["steps_run"] == 4 and summary["final_accuracy"] is not None


def check_done(done, run_dir: Path, layout: str) -> None:
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    check_done_summary(summary_of(run_dir), layout)


def test_launch_env_resolves_real_slurm_variables(slurm_cluster):
    done = slurm_cluster.run([*SRUN, "-N2", "-n4", "bash", "-c",
                              "python -m workload.launch env | tr '\\n' ' '; echo"],
                             cwd=REPO)
    assert done.returncode == 0, done.stderr
    rows = [dict(item.split("=", 1) for item in line.split() if "=" in item)
            for line in done.stdout.splitlines()]
    assert sorted(int(row["RANK"]) for row in rows) == [0, 1, 2, 3]
    assert {(row["WORLD_SIZE"], row["LOCAL_WORLD_SIZE"], row["MASTER_ADDR"])
            for row in rows} == {("4", "2", "nid001")}
    assert len({row["MASTER_PORT"] for row in rows}) == 1
    assert {(row["RANK"], row["NODE_RANK"]) for row in rows} == \
        {("0", "0"), ("1", "0"), ("2", "1"), ("3", "1")}


def test_per_task_layout_through_the_entrypoint(slurm_cluster, tmp_path):
    out = tmp_path / "per-task"
    done = slurm_cluster.run([*SRUN, "-N2", "-n4", ENTRYPOINT, "train", *TINY,
                              "--output-dir", str(out)], cwd=tmp_path)
    check_done(done, out, "per-task")


def test_check_catches_torchrun_once_per_task(slurm_cluster):
    done = slurm_cluster.run([*SRUN, "-N1", "-n2", "python", "-m", "workload.launch", "check",
                              "--command", "torchrun"], cwd=REPO)
    assert done.returncode != 0
    assert "torchrun is started once per task" in done.stdout


def submit_job_script(slurm_cluster, tmp_path: Path, script: str, layout: str,
                      **settings: str) -> Path:
    """sbatch a jobs/ script on the test cluster with the host's Python (RUNTIME=none).

    The cluster has no GPUs, so the script's GPU requests are left out; everything else
    (jobs/lib/launch.sh: srun options, the layout logic, entrypoint.sh) runs as on a real
    site.
    """
    text = (REPO / "jobs" / script).read_text()
    body = "\n".join(line for line in text.splitlines() if not line.startswith("#SBATCH --gpus"))
    job = tmp_path / script
    job.write_text(body + "\n")
    env = slurm_cluster.env | {"JOBS_DIR": str(REPO / "jobs"), "RUNTIME": "none",
                               "GPUS_PER_NODE": "2", "LAYOUT": layout, **settings}
    out = tmp_path / "job.out"
    job_id = sbatch(slurm_cluster, ["--nodes=2", "--cpus-per-task=2", "--time=10", "--output",
                                    str(out), str(job), *TINY], env=env, cwd=tmp_path)
    state = wait_until_ended(slurm_cluster, job_id, out)
    log = out.read_text() if out.exists() else ""
    assert state == "COMPLETED", log[-3000:]
    return tmp_path / "runs" / str(job_id)


@pytest.mark.parametrize("layout", ["torchrun", "per-task"])
def test_multinode_job_script(slurm_cluster, tmp_path, layout):
    """Per-task: srun starts `train` itself, no entrypoint (what `srun apptainer exec image
    train` does): train resolves SLURM's variables by itself. Torchrun: one agent per
    node, each starting 2 workers."""
    run_dir = submit_job_script(slurm_cluster, tmp_path, "multinode.sbatch", layout)
    expected = "torchrun-per-node" if layout == "torchrun" else "per-task"
    summary = summary_of(run_dir)
    check_done_summary(summary, expected)
    assert summary["local_world_size"] == 2
    # Only rank 0 logs the epoch lines.
    assert (tmp_path / "job.out").read_text().count("epoch 1/1") == 1


def test_multinode_job_script_check_mode(slurm_cluster, tmp_path):
    submit_job_script(slurm_cluster, tmp_path, "multinode.sbatch", "per-task", LAUNCH_CHECK="1")
    log = (tmp_path / "job.out").read_text()
    # One report per task: 2 nodes x GPUS_PER_NODE=2, all sound.
    assert log.count("layout: per-task, rank") == 4 and log.count("check: ok") == 4, log
    assert not (tmp_path / "runs").exists()


def test_torchrun_restart_across_two_nodes(slurm_cluster, tmp_path):
    # Elastic restart across nodes: one worker per node, the one on the second node dies
    # once; both agents start a new round (c10d rendezvous, a fresh store per round, set
    # by the entrypoint) and the new group must connect and all_reduce.
    helper = REPO / "tests" / "scripts" / "die_once_plain.py"
    env = slurm_cluster.env | {"DIE_ONCE_MARKER": str(tmp_path / "died")}
    done = slurm_cluster.run([*SRUN, "-N2", "--ntasks-per-node=1", ENTRYPOINT, "torchrun",
                              "--nproc-per-node=1", "--max-restarts=1", str(helper)],
                             cwd=tmp_path, env=env)
    log = done.stdout + done.stderr
    assert done.returncode == 0, log[-4000:]
    assert "rank 1: dying on attempt 0" in log, "rank 1 never died: the test proved nothing"
    assert log.count("all_reduce 3.0") == 2, log[-4000:]


@pytest.mark.root  # a mount namespace hides the spool, as a container without the bind
def test_doctor_checks_the_pmix_plugin_srun_started_and_names_the_bind(slurm_cluster,
                                                                       tmp_path):
    """srun --mpi=pmix (the real plugin, Debian's libpmix): doctor finds PMIx's server
    folder; in a mount namespace where the node's spool is hidden, as in a container that
    does not bind it, doctor warns and names the folder to bind."""
    doctor = f"python -m workload.doctor --device cpu {' '.join(DOCTOR_FAST)} --json"
    hide = 'mount -t tmpfs none "$(dirname "$PMIX_SERVER_TMPDIR")"'
    script = (f"{doctor} {tmp_path}/seen.json && unshare --mount --propagation private "
              f"sh -c '{hide} && exec {doctor} {tmp_path}/hidden.json'")
    done = slurm_cluster.run([*SRUN, "--mpi=pmix", "-N1", "-n1", "bash", "-c", script],
                             cwd=REPO)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    [seen], [hidden] = (by_check(json.loads((tmp_path / f"{name}.json").read_text()), "mpi")
                        for name in ("seen", "hidden"))
    assert seen["status"] == "ok" and "srun --mpi=pmix" in seen["detail"], seen
    assert hidden["status"] == "warn" and "is not visible here" in hidden["detail"], hidden
    assert "apptainer exec --bind " in hidden["fix"] and "--mpi=none" in hidden["fix"]
