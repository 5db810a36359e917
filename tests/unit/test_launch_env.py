"""Resolution rules as a table: one environment per case, replaced wholesale.

Each case runs ``python -m workload.launch env`` (its ``main``) with ``os.environ``
cleared and set to exactly the case's variables, then compares the KEY=VALUE lines.
Cases marked "real" come from tests/data/slurm_env, captured on the test cluster
(Debian slurm-wlm 22.05): `sbatch -N2 -n4` (batch.env), `srun -N2 -n4` (step.N.env), a
heterogeneous job `-N1 -n2 : -N1 -n1` (hbatch.env, hstep.N.env, hg1.env = group 1 only).
"""

from __future__ import annotations

import os
from unittest import mock

import pytest

from tests.helpers import TESTS
from workload.launch import resolve
from workload.launch.__main__ import main

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


def run_cli(env: dict[str, str], args: list[str], capsys) -> tuple[int, str, str]:
    with mock.patch.dict(os.environ, env, clear=True), \
            mock.patch("workload.launch.resolve.usable_cpus", return_value=CPUS):
        status = main(["env", *args])
    out, err = capsys.readouterr()
    return status, out, err


def parse(out: str) -> tuple[str, dict[str, str]]:
    layout = next(line.split(": ", 1)[1] for line in out.splitlines()
                  if line.startswith("# layout: "))
    values = dict(line.split("=", 1) for line in out.splitlines()
                  if line and not line.startswith("#"))
    return layout, values


def test_table_has_at_least_thirty_cases():
    assert len(GOOD) + len(BAD) >= 30


@pytest.mark.parametrize("env,args,expected,layout", [c[1:] for c in GOOD],
                         ids=[c[0] for c in GOOD])
def test_resolution(env, args, expected, layout, capsys):
    status, out, err = run_cli(env | {"CUDA_VISIBLE_DEVICES": ""}, args, capsys)
    assert status == 0, err
    got_layout, values = parse(out)
    assert got_layout == layout
    assert {key: values.get(key) for key in expected} == expected


@pytest.mark.parametrize("env,name", [c[1:] for c in BAD], ids=[c[0] for c in BAD])
def test_bad_value_exits_2_naming_it(env, name, capsys):
    status, out, err = run_cli(env, [], capsys)
    assert status == 2
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and name in lines[0] and "fix:" in lines[0]


def test_user_value_disagreeing_with_slurm_warns(capsys):
    status, _, err = run_cli(step(procid="1") | {"RANK": "3"}, [], capsys)
    assert status == 0
    assert "RANK=3 is already set and kept" in err and "SLURM_PROCID=1" in err


def test_torchrun_worker_does_not_warn_about_slurm_task_ids(capsys):
    env = step(per_node="1(x2)", ntasks="2", procid="1", nodeid="1") | TORCHRUN_WORKER
    status, _, err = run_cli(env, [], capsys)
    assert status == 0 and err == ""


def test_two_steps_of_one_job_get_different_ports(capsys):
    ports = {parse(run_cli(step(step_id=s), [], capsys)[1])[1]["MASTER_PORT"]
             for s in ("0", "1", "2")}
    assert len(ports) == 3


def test_two_jobs_on_one_node_get_different_ports(capsys):
    ports = {parse(run_cli(step(job=j), [], capsys)[1])[1]["MASTER_PORT"]
             for j in ("4100", "4101", "4102")}
    assert len(ports) == 3


@pytest.mark.parametrize("visible,local_rank,gpu", [("3", "1", "cuda:0"),
                                                    ("0,1,2,3", "2", "cuda:2")])
def test_gpu_for_each_rank(visible, local_rank, gpu, capsys):
    env = step(per_node="4(x2)", ntasks="8", procid=local_rank, localid=local_rank,
               CUDA_VISIBLE_DEVICES=visible)
    _, out, _ = run_cli(env, [], capsys)
    assert f"# gpu: {gpu}" in out.splitlines()


def test_output_is_sourceable_by_a_shell(tmp_path, capsys):
    import subprocess
    _, out, _ = run_cli(real("step.3.env"), [], capsys)
    script = tmp_path / "env.sh"
    script.write_text(out)
    done = subprocess.run(["bash", "-c", f"set -eu; . {script}; echo $RANK/$WORLD_SIZE"],
                          capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"})
    assert done.stdout.strip() == "3/4"


# ------------------------------------------------------------------ check
CHECK = [
    ("per-task-matches-gpus", step(per_node="4(x2)", ntasks="8", CUDA_VISIBLE_DEVICES="0,1,2,3"),
     [], 0, "check: ok"),
    ("more-tasks-than-gpus", step(per_node="4(x2)", ntasks="8", CUDA_VISIBLE_DEVICES="0,1"),
     [], 1, "--gpus-per-task=1"),
    ("fewer-tasks-than-gpus", step(per_node="1(x2)", ntasks="2", CUDA_VISIBLE_DEVICES="0,1,2,3"),
     [], 1, "torchrun --nproc-per-node=4"),
    ("torchrun-once-per-task", step(), ["--command", "torchrun"], 1,
     "torchrun is started once per task"),
    ("torchrun-worker-in-per-task-step", step() | TORCHRUN_WORKER | {"RANK": "1",
                                                                     "LOCAL_RANK": "1"},
     [], 1, "srun --ntasks-per-node=1"),
    ("batch-script-outside-srun", real("batch.env"), [], 1, "start it with srun"),
    ("procid-not-below-ntasks", step(procid="4"), [], 2, ""),
    ("ranks-on-several-nodes-without-an-address",
     {"RANK": "0", "WORLD_SIZE": "8", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "4"}, [], 1,
     "set MASTER_ADDR to rank 0's host name"),
    ("ranks-all-on-this-host-need-no-address",
     {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}, [], 0,
     "rendezvous 127.0.0.1:29500"),
    ("torchrun-on-several-nodes-without-an-address",
     {"SLURM_JOB_ID": "5", "SLURM_STEP_ID": "0", "SLURM_STEP_NUM_NODES": "2",
      "SLURM_STEP_NUM_TASKS": "2", "SLURM_STEP_TASKS_PER_NODE": "1(x2)",
      "SLURM_NODEID": "0", "SLURM_PROCID": "0", "SLURM_LOCALID": "0"},
     ["--command", "torchrun"], 1, "set MASTER_ADDR"),
    ("step-smaller-than-job-is-a-note", step(ntasks="2", per_node="1(x2)") | {
        "SLURM_NTASKS": "4"}, [], 0, "note: this step runs 2 tasks of the job's 4"),
]


@pytest.mark.parametrize("env,args,status,text", [c[1:] for c in CHECK],
                         ids=[c[0] for c in CHECK])
def test_check(env, args, status, text, capsys):
    env = {"CUDA_VISIBLE_DEVICES": ""} | env
    with mock.patch.dict(os.environ, env, clear=True), \
            mock.patch("workload.launch.resolve.usable_cpus", return_value=CPUS):
        got = main(["check", *args])
    out, err = capsys.readouterr()
    assert got == status, out + err
    assert text in out + err


def test_ranks_on_several_nodes_without_an_address_warn(capsys):
    # `env` (what entrypoint.sh and train use) still resolves, but says what to set.
    env = {"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4"}
    status, out, err = run_cli(env, [], capsys)
    assert status == 0 and parse(out)[1]["MASTER_ADDR"] == "127.0.0.1"
    assert "span 2 nodes" in err and "set MASTER_ADDR" in err
    status, out, err = run_cli(env | {"MASTER_ADDR": "nid001"}, [], capsys)
    assert status == 0 and err == ""


def test_bogus_cpus_per_task_is_capped_to_this_process_cpus(capsys):
    status, out, err = run_cli(step(SLURM_CPUS_PER_TASK="999999999"), [], capsys)
    assert parse(out)[1]["OMP_NUM_THREADS"] == str(CPUS)
    assert "SLURM_CPUS_PER_TASK=999999999" in err and f"only {CPUS} CPUs" in err
    # Unmocked: the real affinity mask of this test process.
    res = resolve(step(SLURM_CPUS_PER_TASK="999999999"))
    assert res.threads == len(os.sched_getaffinity(0))
