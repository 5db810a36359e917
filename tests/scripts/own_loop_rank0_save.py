"""A user's DDP loop that saves on rank 0 only, the habit of torch.save loops (run by
tests/e2e/test_checkpoint_own_loop.py as two gloo ranks):

    python tests/scripts/own_loop_rank0_save.py FOLDER TIMEOUT_S

It trains a small model and, at step 2, calls `ckpt.save` under `if rank == 0:`; it prints
"step N" after each step and "saving step 2" before the save."""

import datetime
import sys

import torch
import torch.distributed as dist
from torch import nn

from workload.checkpoint import Checkpoints
from workload.launch import setup


def main(folder: str, timeout_s: float) -> None:
    me = setup()
    dist.init_process_group(timeout=datetime.timedelta(seconds=timeout_s))
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(nn.Linear(8, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    ckpt = Checkpoints(folder, async_save=False)
    for step in range(1, 5):
        model(torch.randn(4, 8)).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()
        print(f"step {step}", flush=True)
        if step == 2 and me.rank == 0:
            print("saving step 2", flush=True)
            ckpt.save(step, model=model, optimizer=optimizer)
    ckpt.close()


if __name__ == "__main__":
    main(sys.argv[1], float(sys.argv[2]))
