"""The small collectives of workload.distributed, in a real two-rank gloo group: rank 0's
numbers reach every rank whatever the others pass, and a flag set on one rank is set on
all."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from tests.helpers import clean_env

RANK_CODE = """
from workload import distributed
info = distributed.init_distributed("cpu", 60, None)
numbers = distributed.main_rank_numbers([7 + 10 * info.rank, info.rank, 2**62], info)
flags = distributed.any_rank([info.rank == 1, False], info.device)
print(numbers, flags)
distributed.teardown()
"""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.slow
def test_two_ranks_learn_rank_0s_numbers_and_any_ranks_flags():
    base = {**clean_env(), "PYTHONPATH": os.environ.get("PYTHONPATH", ""),
            "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(free_port())}
    ranks = [subprocess.Popen([sys.executable, "-c", RANK_CODE], text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              env={**base, "RANK": str(rank), "LOCAL_RANK": str(rank)})
             for rank in range(2)]
    outputs = [rank.communicate(timeout=120) for rank in ranks]
    assert [rank.returncode for rank in ranks] == [0, 0], outputs
    assert [out.strip() for out, _ in outputs] == ["[7, 0, 4611686018427387904] [True, False]"] * 2
