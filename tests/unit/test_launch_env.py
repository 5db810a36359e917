"""Resolution rules as a table: one environment per case, replaced wholesale.

Each case runs ``python -m workload.launch env`` (its ``main``) with ``os.environ``
cleared and set to exactly the case's variables, then compares the KEY=VALUE lines. The
table itself is in tests/helpers/launch_table.py (tests/unit/test_setup.py runs the same
cases through workload.launch.setup()).
"""

from __future__ import annotations

import os
from unittest import mock

import pytest

from tests.helpers.launch_table import (BAD, CPU_SHARES, CPUS, GOOD, TORCHRUN_WORKER, real,
                                       step)
from workload.launch import resolve
from workload.launch.__main__ import main


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


@pytest.mark.parametrize("env,cpus", [c[1:] for c in CPU_SHARES],
                         ids=[c[0] for c in CPU_SHARES])
def test_the_cpus_a_process_owns(env, cpus, capsys):
    status, out, err = run_cli(env | {"CUDA_VISIBLE_DEVICES": ""}, [], capsys)
    assert status == 0, err
    assert f"# cpus: {cpus}" in out.splitlines()


def test_torchrun_workers_take_their_share_for_data_workers(monkeypatch):
    from workload.launch.devices import default_workers

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(64)))
    for key, value in (real("torchrun.1.env") | {"SLURM_CPUS_PER_TASK": "16",
                                                 "LOCAL_WORLD_SIZE": "4"}).items():
        monkeypatch.setenv(key, value)
    assert default_workers(4) == 3, "16 CPUs shared by 4 workers: 4 each, one for the loop"
    monkeypatch.delenv("TORCHELASTIC_RUN_ID")
    monkeypatch.delenv("TORCHELASTIC_RESTART_COUNT")
    assert default_workers(4) == 8, "a task of its own (srun per task): its 16 CPUs, at most 8"


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


@pytest.mark.parametrize("addr, warns", [("nid001i", False), ("nid001-hsn0", False),
                                         ("nid001.cluster", False), ("nid0010", True),
                                         ("nid002", True), ("10.0.0.7", True)])
def test_master_addr_naming_the_first_node_by_another_interface_is_kept_quietly(
        addr, warns, capsys):
    """JSC's pages export MASTER_ADDR=<first node>i (the InfiniBand host name): kept
    without a warning that would tell the user to unset it; another host still warns."""
    status, out, err = run_cli(step() | {"MASTER_ADDR": addr}, [], capsys)
    assert status == 0 and parse(out)[1]["MASTER_ADDR"] == addr
    assert ("MASTER_ADDR=" + addr + " is already set and kept" in err) == warns, err


def test_torchrun_worker_does_not_warn_about_slurm_task_ids(capsys):
    env = step(per_node="1(x2)", ntasks="2", procid="1", nodeid="1") | TORCHRUN_WORKER
    status, _, err = run_cli(env, [], capsys)
    assert status == 0 and err == ""


def test_torchrun_worker_s_node_rank_is_its_group_rank_without_a_warning(capsys):
    """torchrun's c10d rendezvous numbers the nodes in order of arrival: the worker on
    SLURM's node 1 may be group 0. The NODE_RANK it inherited from the launcher was a
    hint torchrun ignored; GROUP_RANK replaces it, and nothing tells the user to unset
    a value they never set (seen on a site page's two-node torchrun step)."""
    from workload.launch.resolve import resolve

    env = step(per_node="1(x2)", ntasks="2", procid="1", nodeid="1") | TORCHRUN_WORKER | {
        "NODE_RANK": "1", "GROUP_RANK": "0"}
    status, out, err = run_cli(env, [], capsys)
    assert status == 0 and err == "" and parse(out)[1]["NODE_RANK"] == "0"
    exported = dict(env)
    resolve(env).export(exported)
    assert exported["NODE_RANK"] == "0" and exported["RANK"] == "5"


def test_torchrun_standalone_worker_keeps_its_rendezvous_without_a_warning(capsys):
    """torchrun --standalone in a SLURM step gives its workers localhost and a free port."""
    env = step(per_node="1(x2)", ntasks="2") | TORCHRUN_WORKER | {
        "MASTER_ADDR": "localhost", "MASTER_PORT": "36865"}
    status, out, err = run_cli(env, [], capsys)
    assert status == 0 and err == ""
    assert {k: parse(out)[1][k] for k in ("MASTER_ADDR", "MASTER_PORT")} == {
        "MASTER_ADDR": "localhost", "MASTER_PORT": "36865"}


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
