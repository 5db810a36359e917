"""Where a process sits is one record: the launch layer's `Launch` (what a user's script
gets from setup()), which the runtime's DistInfo reads through instead of copying."""

from __future__ import annotations

import dataclasses
import os
from unittest import mock

import pytest
import torch

from tests.helpers import clean_env
from tests.helpers.launch_table import CPUS, GOOD
from workload.distributed import DistInfo, apply_launch_env, init_distributed
from workload.launch import Launch, setup


def test_the_runtime_reads_the_launch_record_setup_returns():
    env = {**clean_env(), "SLURM_JOB_ID": "4242", "SLURM_PROCID": "0", "SLURM_NTASKS": "1",
           "SLURM_NODEID": "0", "SLURM_LOCALID": "0", "SLURM_JOB_NODELIST": "node1"}
    with mock.patch.dict(os.environ, env, clear=True):
        info = init_distributed("cpu", 600, None)
        mine = setup(dict(os.environ), quiet=True)
    # setup() takes a GPU when there is one; `--device cpu` is the runtime's choice.
    assert isinstance(info.launch, Launch)
    assert info.launch == dataclasses.replace(mine, device="cpu", gpu_index=None)
    assert (info.rank, info.local_rank, info.world_size, info.local_world_size, info.layout,
            info.is_main, info.num_nodes, info.backend) == (0, 0, 1, 1, "single", True, 1, None)
    assert info.device == torch.device("cpu")


def test_a_process_alone_is_rank_0_of_1_without_a_group():
    alone = DistInfo.alone(torch.device("cpu"))
    assert (alone.rank, alone.world_size, alone.is_main, alone.backend) == (0, 1, True, None)


# The launch table's workers of a job of several ranks: the runtime exports what it
# resolved for them, a single process leaves its environment alone.
SEVERAL = [case for case in GOOD if not case[2] and case[3].get("WORLD_SIZE", "1") != "1"]


@pytest.mark.parametrize("env", [case[1] for case in SEVERAL], ids=[c[0] for c in SEVERAL])
def test_the_runtime_and_setup_export_by_one_rule(env):
    env = env | {"CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "3", "MASTER_PORT": "12345"}
    runtime, script = dict(env), dict(env)
    with mock.patch("workload.launch.resolve.usable_cpus", return_value=CPUS), \
            mock.patch("workload.launch.script._cuda", return_value=None):
        resolved = apply_launch_env(runtime)
        setup(script, quiet=True)
    assert {key: runtime.get(key) for key in resolved.values} == {
        key: script.get(key) for key in resolved.values}
    assert runtime["MASTER_PORT"] == "12345" and runtime["OMP_NUM_THREADS"] == "3"
