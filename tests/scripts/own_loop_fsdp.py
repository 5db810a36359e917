"""A user's own FSDP2 loop with workload.checkpoint.Checkpoints (run as 2 gloo ranks by
tests/e2e/test_checkpoint_own_loop.py):

    python tests/scripts/own_loop_fsdp.py FOLDER STEPS

Saves every 3 steps, each rank with an `extra` of its own; every rank prints the `extra`
it resumed with, and rank 0 the step it started from and a digest of the full
parameters at the end."""

import hashlib
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard

from workload.checkpoint import Checkpoints
from workload.launch import end_process, setup


def main() -> None:
    me = setup()
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Linear(16, 4))
    for layer in model:
        fully_shard(layer)
    fully_shard(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    ckpt = Checkpoints(sys.argv[1])
    start = ckpt.resume(model=model, optimizer=optimizer)
    print(f"rank {me.rank} resumed with extra {ckpt.extra}", flush=True)
    for step in range(start, int(sys.argv[2])):
        batch = torch.randn(4, 8, generator=torch.Generator().manual_seed(100 * me.rank + step))
        model(batch).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()
        if (step + 1) % 3 == 0:
            ckpt.save(step + 1, model=model, optimizer=optimizer,
                      extra={"rank": me.rank, "batches": step + 1})  # each rank's own
    digest = hashlib.sha256()
    for param in model.parameters():
        digest.update(param.full_tensor().detach().numpy().tobytes())
    ckpt.close()
    if me.is_main:
        print(f"started at step {start}, weights {digest.hexdigest()[:16]}", flush=True)
    dist.destroy_process_group()


end_process(main)  # as a user's script ends: docs/your-script.md
