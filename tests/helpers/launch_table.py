"""The launch table: environments and what `python -m workload.launch env` must resolve
from each, shared by tests/unit/test_launch_env.py (the CLI) and tests/unit/test_setup.py
(workload.launch.setup(), which applies the same rules). Cases marked "real" come from
tests/data/slurm_env, captured on the test cluster (Debian slurm-wlm 22.05): `sbatch -N2
-n4` (batch.env), `srun -N2 -n4` (step.N.env), a heterogeneous job `-N1 -n2 : -N1 -n1`
(hbatch.env, hstep.N.env, hg1.env = group 1 only). torchrun.1.env is a worker of `srun -N2
--ntasks-per-node=1 --cpus-per-task=2 torchrun --nproc-per-node=2` (rank 3, on the second
node): the step's SLURM variables in the captured form, and the ones torchrun sets for
its workers."""

from __future__ import annotations

from tests.helpers import TESTS

DATA = TESTS / "data" / "slurm_env"
# The CPUs every case's process may use (its affinity mask), fixed so the table does not
# depend on the machine that runs it.
CPUS = 64


def real(name: str, **override: str) -> dict[str, str]:
    lines = (DATA / name).read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if line) | override


def step(job="77", step_id="0", nodes="nid[001-002]", ntasks="4", per_node="2(x2)",
         procid="0", localid="0", nodeid="0", **extra) -> dict[str, str]:
    """A job step as srun sets it (only the variables the rules read)."""
    return {"SLURM_JOB_ID": job, "SLURM_STEP_ID": step_id, "SLURM_STEP_NODELIST": nodes,
            "SLURM_JOB_NODELIST": nodes, "SLURM_STEP_NUM_TASKS": ntasks,
            "SLURM_NTASKS": ntasks, "SLURM_STEP_TASKS_PER_NODE": per_node,
            "SLURM_TASKS_PER_NODE": per_node, "SLURM_PROCID": procid,
            "SLURM_LOCALID": localid, "SLURM_NODEID": nodeid, **extra}


TORCHRUN_WORKER = {"TORCHELASTIC_RUN_ID": "none", "TORCHELASTIC_RESTART_COUNT": "0",
                   "RANK": "5", "LOCAL_RANK": "1", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4",
                   "GROUP_RANK": "1", "MASTER_ADDR": "nid001", "MASTER_PORT": "20770"}

# (case id, environment, extra CLI args, expected subset of output, expected layout)
GOOD = [
    ("empty-env-single", {}, [],
     dict(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1", NODE_RANK="0",
          MASTER_ADDR="127.0.0.1", MASTER_PORT="29500"), "single"),
    ("real-srun-N2-n4-task0", real("step.0.env"), [],
     dict(RANK="0", LOCAL_RANK="0", WORLD_SIZE="4", LOCAL_WORLD_SIZE="2", NODE_RANK="0",
          MASTER_ADDR="nid001", MASTER_PORT="20010"), "per-task"),
    ("real-srun-N2-n4-task3", real("step.3.env"), [],
     dict(RANK="3", LOCAL_RANK="1", WORLD_SIZE="4", LOCAL_WORLD_SIZE="2", NODE_RANK="1",
          MASTER_ADDR="nid001"), "per-task"),
    ("real-batch-script-is-one-process", real("batch.env"), [],
     dict(RANK="0", WORLD_SIZE="1", MASTER_ADDR="nid001", MASTER_PORT="20019"), "single"),
    ("step-wins-over-job", step(ntasks="2", per_node="1(x2)") | {
        "SLURM_NTASKS": "8", "SLURM_TASKS_PER_NODE": "4(x2)"}, [],
     dict(WORLD_SIZE="2", LOCAL_WORLD_SIZE="1"), "per-task"),
    ("step-nodelist-wins-over-job", step(nodes="nid[003-004]") | {
        "SLURM_JOB_NODELIST": "nid[001-004]"}, [], dict(MASTER_ADDR="nid003"), "per-task"),
    ("job-vars-when-step-vars-missing",
     {"SLURM_JOB_ID": "5", "SLURM_STEP_ID": "0", "SLURM_NTASKS": "6", "SLURM_PROCID": "4",
      "SLURM_LOCALID": "1", "SLURM_NODEID": "2", "SLURM_TASKS_PER_NODE": "2(x3)",
      "SLURM_JOB_NODELIST": "cn[10-12]"}, [],
     dict(RANK="4", WORLD_SIZE="6", LOCAL_WORLD_SIZE="2", NODE_RANK="2",
          MASTER_ADDR="cn10"), "per-task"),
    ("zero-padded-range", step(nodes="nid[0007-0009]", ntasks="3", per_node="1(x3)"), [],
     dict(MASTER_ADDR="nid0007"), "per-task"),
    ("several-bracket-groups", step(nodes="gpu[01-02]-ib[0-1]", ntasks="4", per_node="1(x4)"),
     [], dict(MASTER_ADDR="gpu01-ib0"), "per-task"),
    ("comma-list-of-prefixes", step(nodes="login1,nid[010-011]", ntasks="3",
                                    per_node="1(x3)"), [], dict(MASTER_ADDR="login1"), "per-task"),
    ("uneven-tasks-per-node", step(ntasks="5", per_node="3,2", procid="4", localid="1",
                                   nodeid="1"), [],
     dict(RANK="4", LOCAL_WORLD_SIZE="2", NODE_RANK="1"), "per-task"),
    ("real-het-step-across-groups", real("hstep.2.env"), [],
     dict(RANK="2", WORLD_SIZE="3", LOCAL_WORLD_SIZE="1", NODE_RANK="1",
          MASTER_ADDR="nid001", MASTER_PORT="20020"), "per-task"),
    ("real-het-batch", real("hbatch.env"), [], dict(MASTER_ADDR="nid001"), "single"),
    ("real-het-group-1-step", real("hg1.env"), [],
     dict(MASTER_ADDR="nid002", WORLD_SIZE="1"), "per-task"),
    ("het-group-0-before-job-list",
     {"SLURM_JOB_ID": "9", "SLURM_JOB_NODELIST_HET_GROUP_0": "big[3-4]",
      "SLURM_JOB_NODELIST_HET_GROUP_1": "small1", "SLURM_NODELIST": "small1"}, [],
     dict(MASTER_ADDR="big3"), "single"),
    ("legacy-slurm-nodelist-only", {"SLURM_JOBID": "9", "SLURM_NODELIST": "old[5-6]"}, [],
     dict(MASTER_ADDR="old5"), "single"),
    ("torchrun-worker-values-win", step(per_node="1(x2)", ntasks="2", procid="1",
                                        nodeid="1") | TORCHRUN_WORKER, [],
     dict(RANK="5", LOCAL_RANK="1", WORLD_SIZE="8", LOCAL_WORLD_SIZE="4", NODE_RANK="1",
          MASTER_ADDR="nid001", MASTER_PORT="20770"), "torchrun-per-node"),
    ("torchrun-standalone-outside-slurm", TORCHRUN_WORKER | {"GROUP_RANK": "0",
                                                              "MASTER_ADDR": "127.0.0.1"}, [],
     dict(RANK="5", WORLD_SIZE="8", NODE_RANK="0"), "torchrun-per-node"),
    ("user-rank-kept-over-slurm", step(procid="1") | {"RANK": "3"}, [],
     dict(RANK="3", WORLD_SIZE="4"), "per-task"),
    ("user-rendezvous-kept", step() | {"MASTER_ADDR": "10.0.0.7", "MASTER_PORT": "4242"}, [],
     dict(MASTER_ADDR="10.0.0.7", MASTER_PORT="4242"), "per-task"),
    ("port-from-job-and-step", step(job="123456", step_id="3"), [],
     dict(MASTER_PORT=str(20000 + 10 * 456 + 3)), "per-task"),
    ("port-stays-in-range", step(job="999999", step_id="12"), [],
     dict(MASTER_PORT="29992"), "per-task"),
    ("threads-from-cpus-per-task", step(SLURM_CPUS_PER_TASK="8"), [],
     dict(OMP_NUM_THREADS="8"), "per-task"),
    ("threads-shared-under-torchrun", TORCHRUN_WORKER | {"SLURM_CPUS_PER_TASK": "8",
                                                          "OMP_NUM_THREADS": "1"}, [],
     dict(OMP_NUM_THREADS="2"), "torchrun-per-node"),
    ("threads-capped-to-usable-cpus", step(SLURM_CPUS_PER_TASK="999999999"), [],
     dict(OMP_NUM_THREADS=str(CPUS)), "per-task"),
    ("threads-capped-then-shared-under-torchrun",
     TORCHRUN_WORKER | {"SLURM_CPUS_PER_TASK": "999999999", "OMP_NUM_THREADS": "1"}, [],
     dict(OMP_NUM_THREADS=str(CPUS // 4)), "torchrun-per-node"),
    ("threads-user-choice-kept", step(SLURM_CPUS_PER_TASK="8", OMP_NUM_THREADS="3"), [],
     dict(OMP_NUM_THREADS="3"), "per-task"),
    ("outer-torchrun-one-task-per-node",
     step(ntasks="2", per_node="1(x2)", procid="1", nodeid="1", SLURM_STEP_NUM_NODES="2"),
     ["--command", "/usr/local/bin/torchrun"],
     dict(NODE_RANK="1", MASTER_ADDR="nid001", MASTER_PORT="20770", PET_NNODES="2",
          PET_NODE_RANK="1", PET_MASTER_ADDR="nid001", PET_MASTER_PORT="20770"),
     "torchrun-per-node"),
    ("outer-torchrun-user-flag-env-kept",
     step(ntasks="2", per_node="1(x2)", SLURM_STEP_NUM_NODES="2", PET_NNODES="1"),
     ["--command", "torchrun"], dict(PET_NNODES="1"), "torchrun-per-node"),
]

# The CPUs one process owns (`# cpus: N` of `launch env`, Launch.cpus of setup()): its
# data workers and threads come from it. Under torchrun the task's CPUs are shared by its
# LOCAL_WORLD_SIZE workers. (case id, environment, expected CPUs)
CPU_SHARES = [
    ("single-process-owns-its-affinity", {}, CPUS),
    ("per-task-owns-its-task-s-cpus", step(SLURM_CPUS_PER_TASK="8"), 8),
    ("real-torchrun-worker-shares-its-task", real("torchrun.1.env"), 1),
    ("torchrun-workers-share-the-task", TORCHRUN_WORKER | {"SLURM_CPUS_PER_TASK": "32"}, 8),
    ("torchrun-share-at-least-one", TORCHRUN_WORKER | {"SLURM_CPUS_PER_TASK": "2"}, 1),
    ("torchrun-share-of-the-capped-count",
     TORCHRUN_WORKER | {"SLURM_CPUS_PER_TASK": "999999999"}, CPUS // 4),
    ("torchrun-outside-slurm-shares-the-affinity", TORCHRUN_WORKER, CPUS // 4),
]

# (case id, environment, the variable the one-line error must name)
BAD = [
    ("rank-not-integer", {"RANK": "abc"}, "RANK='abc'"),
    ("rank-negative", {"RANK": "-1", "WORLD_SIZE": "2"}, "RANK='-1'"),
    ("rank-not-below-world", {"RANK": "4", "WORLD_SIZE": "4"}, "RANK='4'"),
    ("procid-not-below-ntasks", step(procid="4"), "RANK='4'"),
    ("world-size-zero", {"WORLD_SIZE": "0"}, "WORLD_SIZE='0'"),
    ("local-rank-not-below-local-world", {"LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "2"},
     "LOCAL_RANK='2'"),
    ("port-below-1024", {"MASTER_PORT": "80"}, "MASTER_PORT='80'"),
    ("port-above-65535", {"MASTER_PORT": "70000"}, "MASTER_PORT='70000'"),
    ("port-not-integer", {"MASTER_PORT": "29500a"}, "MASTER_PORT='29500a'"),
    ("unbalanced-node-list", step(nodes="nid[001-"), "SLURM_STEP_NODELIST='nid[001-'"),
    ("reversed-range", step(nodes="nid[009-001]"), "SLURM_STEP_NODELIST"),
    ("bad-tasks-per-node", step(per_node="2(x"), "SLURM_STEP_TASKS_PER_NODE='2(x'"),
    ("procid-not-integer", step(procid="zero"), "SLURM_PROCID='zero'"),
    ("cpus-per-task-not-integer", step(SLURM_CPUS_PER_TASK="lots"), "SLURM_CPUS_PER_TASK"),
    ("semicolon-in-master-addr", {"MASTER_ADDR": "nid001;reboot"}, "MASTER_ADDR"),
    ("command-substitution-in-node-list", step(nodes="nid$(reboot)"), "MASTER_ADDR"),
    ("space-in-master-addr", {"MASTER_ADDR": "nid001 nid002"}, "MASTER_ADDR"),
    ("backtick-in-master-port", {"MASTER_PORT": "`id`"}, "MASTER_PORT"),
]
