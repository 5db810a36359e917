"""A plain user script, no project code: rank 1 dies once, right after joining the group.

    DIE_ONCE_MARKER=/tmp/died torchrun --nproc-per-node=2 --max-restarts=1 \\
        tests/scripts/die_once_plain.py

The marker file makes it once (on several nodes the restart counters differ, so the
attempt number cannot say it). The restarted group must join a new process group and
agree on an all_reduce: every rank then prints ``all_reduce 3.0`` (for two ranks).
"""

import os
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

MARKER = Path(os.environ["DIE_ONCE_MARKER"])
attempt = os.environ["TORCHELASTIC_RESTART_COUNT"]
# A short timeout: a group that cannot connect fails the test quickly instead of hanging.
dist.init_process_group("gloo", timeout=timedelta(seconds=60))
if dist.get_rank() == 1 and not MARKER.exists():
    MARKER.write_text("rank 1 died once\n")
    print(f"rank 1: dying on attempt {attempt}", flush=True)
    os._exit(1)
total = torch.ones(1) * (dist.get_rank() + 1)
dist.all_reduce(total)
print(f"rank {dist.get_rank()}: all_reduce {total.item()} on attempt {attempt}", flush=True)
dist.destroy_process_group()
