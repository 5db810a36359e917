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
model. On SIGUSR2 or SIGTERM (to any rank) all ranks stop at the same step, rank 0 saves
one checkpoint, and every rank exits with status 75, which jobs/lib/requeue.sh turns
into a requeue; the requeued job resumes from that checkpoint.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from workload.launch import PreemptionFlag, exit_for_requeue, setup


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=50, help="training steps in all")
    parser.add_argument("--step-time", type=float, default=0.0,
                        help="seconds to sleep per step (to watch preemption at work)")
    parser.add_argument("--output-dir", type=Path, default=Path("plain-ddp-run"),
                        help="where the checkpoint goes")
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


def save(path: Path, step: int, model: nn.Module, optimizer) -> None:
    """Rank 0 writes the checkpoint atomically: a partial file never has the real name."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    torch.save({"step": step, "model": model.state_dict(),
                "optimizer": optimizer.state_dict()}, tmp)
    os.replace(tmp, path)
    say(f"saved checkpoint at step {step}")


def resume(path: Path, model: nn.Module, optimizer, device: str) -> int:
    """The first step to run: 0, or the one after the saved checkpoint."""
    if not path.exists():
        return 0
    state = torch.load(path, map_location=device, weights_only=True)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    say(f"resumed from step {state['step']}")
    return state["step"] + 1


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
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)
    checkpoint = args.output_dir / "checkpoint.pt"
    start = resume(checkpoint, model, optimizer, me.device)
    data = torch.Generator().manual_seed(1000 + me.rank)  # each rank its own batches
    say(f"rank {me.rank}: training from step {start} on {me.device}")
    loss = torch.zeros(())
    for step in range(start, args.steps):
        x = torch.randn(64, 32, generator=data).to(me.device)
        loss = ddp(x).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        time.sleep(args.step_time)
        stop = torch.tensor([float(flag.is_set())], device=me.device)
        dist.all_reduce(stop)     # a signal to any rank stops every rank at this step
        if stop.item() > 0:
            if me.is_main:
                save(checkpoint, step, model, optimizer)
            dist.barrier()        # nobody exits before the checkpoint is complete
            say(f"rank {me.rank}: preempted at step {step}, exiting 75")
            dist.destroy_process_group()
            exit_for_requeue(step, flag.signal_name)
    if me.is_main:
        say(f"done: {args.steps} steps on {me.world_size} processes, loss {loss.item():.4f}")
    dist.barrier()  # every rank is done before any leaves the group, as in train
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
