"""The private SLURM cluster fixture itself: it runs real steps and cleans up after itself."""

from __future__ import annotations

import os
import subprocess

import pytest

from tests.slurm.cluster import GPU_MODEL, GPUS_PER_NODE, SUITE_ACCOUNT, SlurmCluster

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


def test_a_centres_gpu_model_rule_refuses_each_untyped_request_and_ends_with_its_test(
        slurm_cluster):
    # Alliance's rule, in the cluster's job_submit.lua: every way of asking GPUs without
    # a model is refused at allocation; a typed request runs on the stand-in GPUs.
    slurm_cluster.set_submit_rules({"gpu_model": GPU_MODEL})
    try:
        for request in ("--gpus-per-node=1", "--gres=gpu:1", "--gpus=1", "--gpus-per-task=1"):
            done = slurm_cluster.run(["srun", "-N1", "-n1", request, "true"])
            assert done.returncode != 0, request
            assert "refuses a GPU request without a GPU model" in done.stderr, done.stderr
        typed = slurm_cluster.run(["srun", "-N1", "-n1", f"--gpus-per-node={GPU_MODEL}:2",
                                   "printenv", "SLURM_GPUS_ON_NODE"])
        assert (typed.returncode, typed.stdout.strip()) == (0, str(GPUS_PER_NODE)), typed.stderr
    finally:
        slurm_cluster.set_submit_rules({})
    # Without the rule (every test but a twin's) an untyped request runs.
    assert slurm_cluster.run(["srun", "-N1", "--gpus-per-node=1", "true"]).returncode == 0


def test_a_centres_partitions_hold_its_time_limits_and_end_with_its_test(slurm_cluster):
    slurm_cluster.add_partitions({"accel": {"MaxTime": "7-00:00:00"}, "small": {}}, "accel")
    try:
        longer = slurm_cluster.run(["srun", "-N1", "--time=8-00:00:00", "true"])
        assert longer.returncode != 0
        assert "Requested time limit is invalid" in longer.stderr, longer.stderr
        shown = slurm_cluster.run(["srun", "-N1", "--time=1-00:00:00", "printenv",
                                   "SLURM_JOB_PARTITION"])
        assert shown.stdout.strip() == "accel", shown.stderr
    finally:
        slurm_cluster.reset_centre()
    listed = slurm_cluster.run(["sinfo", "-h", "-o", "%P"]).stdout.split()
    assert listed == ["debug*", "low", "high", "spares"], listed


def test_a_centres_partition_named_as_the_clusters_own_is_the_centres_until_its_test_ends(
        slurm_cluster):
    # Clariden's debug and low (tests/twins/cscs-clariden.toml) have the names of two of
    # the cluster's own partitions: for the test they are the centre's, with its nodes, its
    # limits and the debug partition's QOS (90 node-minutes a job), then the cluster's own.
    def shown(name: str) -> str:
        return slurm_cluster.run(["scontrol", "show", "partition", name]).stdout

    own = {name: shown(name) for name in ("debug", "low")}
    slurm_cluster.add_partitions(
        {"normal": {"MaxTime": "12:00:00"}, "debug": {"MaxTime": "01:30:00", "MaxNodes": "4"},
         "low": {"MaxTime": "1-00:00:00"}, "xfer": {"MaxTime": "1-00:00:00", "MaxNodes": "1"}},
        "normal", {"debug": "MaxTRESMinsPerJob=node=90"})
    try:
        for options, refusal in (
                (("-p", "debug", "--time=01:31:00"), "Requested time limit is invalid"),
                (("-p", "debug", "-N2", "--time=00:46:00"), "QOSMaxNodeMinutesPerJob"),
                (("-p", "low", "--time=1-00:01:00"), "Requested time limit is invalid"),
                (("-p", "xfer", "-N2"), "Node count specification invalid")):
            done = slurm_cluster.run(["srun", *options, "true"])
            assert done.returncode != 0 and refusal in done.stderr, (options, done.stderr)
        # CSCS's own example, 2 nodes x 45 minutes; `low` on both nodes (the cluster's has
        # one), the default `normal`.
        for options in (("-p", "debug", "-N2", "--time=00:45:00"), ("-p", "low", "-N2"), ()):
            done = slurm_cluster.run(["srun", *options, "printenv", "SLURM_JOB_PARTITION"])
            assert done.returncode == 0, (options, done.stderr)
            assert done.stdout.split()[0] == (options[1] if options else "normal"), done.stdout
    finally:
        slurm_cluster.reset_centre()
    assert {name: shown(name) for name in own} == own


def job_qos(slurm_cluster, *options: str) -> subprocess.CompletedProcess:
    """A one-task job's account and QOS, as SLURM put it (or SLURM's refusal)."""
    return slurm_cluster.run(["srun", "-N1", "-n1", *options, "bash", "-c",
                              "scontrol show job $SLURM_JOB_ID | grep -o 'Account=[^ ]*"
                              " QOS=[^ ]*'"])


def test_a_centres_account_and_qos_are_slurms_accounting_and_end_with_its_test(slurm_cluster):
    # Perlmutter's shape (the twin's): a default debug QOS, here with a 30-minute limit,
    # and regular; an account the centre requires of every job (Olivia's, JSC's rule).
    slurm_cluster.set_centre_accounting("m0000", {"debug": "MaxWall=00:30:00",
                                                  "regular": ""}, "debug")
    slurm_cluster.set_submit_rules({"account": "required"})
    try:
        named = job_qos(slurm_cluster, "-A", "m0000")
        assert named.stdout.strip() == "Account=m0000 QOS=debug", named.stderr
        for options, refusal in (
                ((), "requires the project's account of every job"),
                (("-A", "nope"), "Invalid account or account/partition combination"),
                (("-A", "m0000", "-q", "premium"), "Invalid qos specification"),
                (("-A", "m0000", "--time=01:00:00"), "QOSMaxWallDurationPerJobLimit")):
            done = job_qos(slurm_cluster, *options)
            assert done.returncode != 0 and refusal in done.stderr, (options, done.stderr)
        regular = job_qos(slurm_cluster, "-A", "m0000", "-q", "regular", "--time=01:00:00")
        assert regular.stdout.strip() == "Account=m0000 QOS=regular", regular.stderr
    finally:
        slurm_cluster.reset_centre()
    # The suite's own account and QOS again for a job that names none.
    assert job_qos(slurm_cluster).stdout.strip() == f"Account={SUITE_ACCOUNT} QOS=normal"
    # Another centre's (one without QOS) replace them: the first centre's are gone.
    slurm_cluster.set_centre_accounting("nn0000k", {}, None)
    try:
        assert job_qos(slurm_cluster).stdout.strip() == "Account=nn0000k QOS=normal"
        for options in (("-A", "m0000"), ("-q", "regular")):
            assert job_qos(slurm_cluster, *options).returncode != 0, options
    finally:
        slurm_cluster.reset_centre()
