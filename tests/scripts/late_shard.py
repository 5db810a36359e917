"""Run `train`, but rank 1 writes its FSDP shard of every checkpoint half a second late:
rank 0 must wait for it before it lists the files and renames the folder into place.

    torchrun --nproc-per-node=2 tests/scripts/late_shard.py --strategy fsdp ...
"""

from __future__ import annotations

import time

import torch.distributed as dist

from workload.checkpoint import inprocess
from workload.train import cli

LATE_RANK, DELAY_S = 1, 0.5
original_save_shards = inprocess.save_shards


def save_shards_late(*args, **kwargs) -> dict:
    if dist.get_rank() == LATE_RANK:
        time.sleep(DELAY_S)
    return original_save_shards(*args, **kwargs)


inprocess.save_shards = save_shards_late
cli()  # as the `train` program: it ends the process
