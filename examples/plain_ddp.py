"""Your own training script in the image: plain DDP on synthetic data, no trainer.

The same file runs unchanged in every form docs/your-script.md describes:

    python examples/plain_ddp.py                                # a laptop: one process
    srun -N2 --ntasks-per-node=4 apptainer exec --nv hpc-train.sif \
        python examples/plain_ddp.py                            # no entrypoint: setup()
    srun -N2 --ntasks-per-node=4 apptainer exec --nv hpc-train.sif \
        entrypoint.sh python examples/plain_ddp.py              # per task, entrypoint
    srun -N2 --ntasks-per-node=1 apptainer exec --nv hpc-train.sif \
        entrypoint.sh torchrun --nproc-per-node=4 examples/plain_ddp.py   # per node

Every rank checks one all-reduce against the expected sum, then trains a small linear
model, checkpointing with workload.checkpoint.Checkpoints every --save-every steps. On
SIGUSR2 or SIGTERM (to any rank) all ranks stop at the same step, save
one checkpoint, and exit with status 75, which jobs/lib/requeue.sh turns into a requeue;
the requeued job resumes from the newest checkpoint, exactly where it stopped.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from workload.checkpoint import Checkpoints
from workload.launch import PreemptionFlag, end_process, exit_for_requeue, setup

BATCH = 64


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=50, help="training steps in all")
    parser.add_argument("--step-time", type=float, default=0.0,
                        help="seconds to sleep per step (to watch preemption at work)")
    parser.add_argument("--save-every", type=int, default=0,
                        help="save a checkpoint every N steps (0: only when preempted)")
    parser.add_argument("--output-dir", type=Path, default=Path("plain-ddp-run"),
                        help="where the checkpoints go")
    return parser.parse_args()


def say(line: str) -> None:
    """Print one whole line in one write. The image sets PYTHONUNBUFFERED, under which
    print() writes the text and the newline separately: the lines of ranks that share a
    node's output would interleave mid-line."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def check_all_reduce(rank: int, world: int, device: str) -> None:
    total = torch.tensor([rank + 1.0], device=device)
    dist.all_reduce(total)
    expected = world * (world + 1) / 2
    assert total.item() == expected, f"rank {rank}: all_reduce gave {total.item()}"
    say(f"rank {rank} of {world}: all_reduce {total.item():g} ok")


def batch(rank: int, step: int, device: str) -> torch.Tensor:
    """Each rank's batch of a step, drawn from (rank, step) alone: a resumed run reads
    exactly the batches an uninterrupted one would."""
    generator = torch.Generator().manual_seed(1_000_003 * rank + step)
    return torch.randn(BATCH, 32, generator=generator).to(device)


def weights_digest(model: nn.Module) -> str:
    digest = hashlib.sha256()
    for name, param in model.named_parameters():
        digest.update(name.encode() + param.detach().cpu().numpy().tobytes())
    return digest.hexdigest()[:16]


def main() -> None:
    args = parse_args()
    me = setup()                  # rank, GPU, rendezvous: from SLURM, torchrun or nothing
    dist.init_process_group()     # env:// with no arguments
    check_all_reduce(me.rank, me.world_size, me.device)
    flag = PreemptionFlag().install()  # SIGUSR2, SIGTERM
    torch.manual_seed(0)
    model = nn.Linear(32, 4).to(me.device)
    ddp = nn.parallel.DistributedDataParallel(
        model, device_ids=[me.gpu_index] if me.gpu_index is not None else None)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=10, gamma=0.5)
    ckpt = Checkpoints(args.output_dir)  # rank 0 locks the folder: one run writes there
    parts = dict(model=ddp, optimizer=optimizer, scheduler=scheduler)
    start = ckpt.resume(**parts)          # 0, or the steps the newest checkpoint holds
    if start and me.is_main:
        say(f"resumed from step {start} ({ckpt.extra['samples']} samples seen)")
    say(f"rank {me.rank}: training from step {start} on {me.device}")
    loss = torch.zeros(())
    for step in range(start, args.steps):
        loss = ddp(batch(me.rank, step, me.device)).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        scheduler.step()
        time.sleep(args.step_time)
        done, extra = step + 1, {"samples": (step + 1) * BATCH * me.world_size}
        if ckpt.preempted(flag):  # a signal to any rank stops every rank at this step
            ckpt.save(done, **parts, extra=extra)
            if me.is_main:
                say(f"saved checkpoint at step {done}")
            ckpt.close()
            say(f"rank {me.rank}: preempted at step {done}, exiting 75")
            dist.destroy_process_group()
            exit_for_requeue(done, flag.signal_name)
        if args.save_every and done % args.save_every == 0:
            ckpt.save(done, **parts, extra=extra)
            if me.is_main:
                say(f"saved checkpoint at step {done}")
    ckpt.close()
    if me.is_main:
        say(f"done: {args.steps} steps on {me.world_size} processes, loss {loss.item():.4f}, "
            f"weights {weights_digest(model)}")
    dist.barrier()  # every rank is done before any leaves the group, as in train
    dist.destroy_process_group()


if __name__ == "__main__":
    end_process(main)  # not main(): docs/your-script.md, "The last line"
