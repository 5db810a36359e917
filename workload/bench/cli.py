"""`bench`: measure the input pipelines and training speed, next to the reference workload.

Input pipelines, every available backend against the reference per-sample pipeline:
    bench input --dataset cifar100 --data-dir $DATA --json input.json

Training across batch sizes on one GPU (ResNet-18 at 32..256 and the Wide ResNet):
    bench train --dataset synthetic --json train.json

The reference loop against the optimised one (and what --compile adds), side by side:
    bench train --versus-reference --model wrn --batch-size 64 --compile

One node of four GPUs (per-device and total rates):
    torchrun --nproc-per-node 4 -m workload.bench.cli train --model resnet18

SLURM, two nodes of four GPUs each:
    srun -N2 --ntasks-per-node 4 --gpus-per-task 1 bench train --model wrn --batch-size 256

A checkpoint's commit against a bare write and fsync of the same bytes, on the disk where
the run folder would be (the Wide ResNet's 137 MB state):
    bench commit --size-mb 137 --rounds 9 --dir $SCRATCH

CPU smoke run:
    bench input --dataset synthetic --synthetic-size 2048 --batch-size 64 --batches 4
    bench train --device cpu --model wrn --width 8 --batch-sizes 8 --steps 2

Every figure comes with a fingerprint of the machine and software (--json PATH); runs of
different configurations alternate, so a busy machine slows them all alike.
"""

from __future__ import annotations

import argparse
import sys

from workload.bench import flags
from workload.caches import use_private_caches
from workload.commands import command_parser, run_command
from workload.config import build_config
from workload.launch.preemption import StartUpFlag

PROG = "bench"


def build_parser() -> argparse.ArgumentParser:
    p = command_parser(PROG, __doc__)
    sub = p.add_subparsers(dest="command", required=True)
    inp = sub.add_parser("input", help="images/s of the data backends and the reference")
    flags.add_common(inp)
    flags.add_input(inp)
    trn = sub.add_parser("train", help="training images/s, FLOPs, share of peak")
    flags.add_common(trn)
    flags.add_train(trn)
    com = sub.add_parser("commit", help="a checkpoint's commit against a bare write+fsync")
    flags.add_commit(com)
    return p


def bench(args: dict, early: StartUpFlag) -> dict:
    if args["command"] == "commit":  # no model, no data: train's flags are not its own
        flags.check_commit(args)
        from workload.bench import commit

        return commit.run(args)
    flags.check(args)
    build_config({**args, **flags.BENCH_FIXED})  # train's flags, validated before torch
    use_private_caches(PROG)
    from workload.bench import input as input_bench
    from workload.bench import train as train_bench

    command = args.pop("command")
    return (input_bench if command == "input" else train_bench).run(args, early)


def main(argv: list[str] | None = None) -> int:
    args = vars(build_parser().parse_args(argv))
    # argv None: the console script or `python -m`, whose process ends after this.
    return run_command(PROG, lambda early: bench(args, early), keep_signals=argv is None)


if __name__ == "__main__":
    sys.exit(main())
