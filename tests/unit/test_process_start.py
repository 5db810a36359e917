"""Where a process sits is one record: the launch layer's `Launch` (what a user's script
gets from setup()), which the runtime's DistInfo reads through instead of copying."""

from __future__ import annotations

import dataclasses
import os
from unittest import mock

import torch

from tests.helpers import clean_env
from workload.distributed import DistInfo, init_distributed
from workload.launch import Launch, setup


def test_the_runtime_reads_the_launch_record_setup_returns():
    env = {**clean_env(), "SLURM_JOB_ID": "4242", "SLURM_PROCID": "0", "SLURM_NTASKS": "1",
           "SLURM_NODEID": "0", "SLURM_LOCALID": "0", "SLURM_JOB_NODELIST": "node1"}
    with mock.patch.dict(os.environ, env, clear=True):
        info = init_distributed("cpu")
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
