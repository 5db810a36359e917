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

CPU smoke run:
    bench input --dataset synthetic --synthetic-size 2048 --batch-size 64 --batches 4
    bench train --device cpu --model wrn --width 8 --batch-sizes 8 --steps 2

Every figure comes with a fingerprint of the machine and software (--json PATH); runs of
different configurations alternate, so a busy machine slows them all alike.
"""

from __future__ import annotations

import argparse
import sys

import torch

from workload import distributed
from workload.bench import input as input_bench
from workload.bench import train as train_bench
from workload.errors import UsageError, exit_with_usage_error
from workload.logs import setup_logging
from workload.train import add_data_arguments, add_hardware_arguments, add_model_arguments

BENCH_DEFAULTS = dict(dataset="synthetic", synthetic_size=10_000)


def _common(p: argparse.ArgumentParser) -> None:
    add_data_arguments(p)
    add_hardware_arguments(p)
    p.add_argument("--batch-size", type=int, help="images per batch (input: 256)")
    p.add_argument("--seed", type=int, help="data order and augmentation seed (0)")
    p.add_argument("--json", help="write the results and the fingerprint to this file")
    p.add_argument("--threads", type=int, default=0,
                   help="torch CPU threads for every run (0 = torch's default)")
    p.set_defaults(**BENCH_DEFAULTS)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="bench", description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n".join(__doc__.split("\n")[2:]))
    sub = p.add_subparsers(dest="command", required=True)
    inp = sub.add_parser("input", help="images/s of the data backends and the reference")
    _common(inp)
    input_bench.add_arguments(inp)
    trn = sub.add_parser("train", help="training images/s, FLOPs, share of peak")
    _common(trn)
    add_model_arguments(trn)
    train_bench.add_arguments(trn)
    return p


def set_threads(count: int) -> None:
    # On a shared, busy CPU, fewer threads than cores can be much faster: parallel regions
    # wait for their slowest thread. One setting for every run keeps the comparison fair.
    if count < 0:
        raise UsageError(f"--threads must be 0 (torch's default) or more, got {count}")
    if count:
        torch.set_num_threads(count)


def main(argv: list[str] | None = None) -> None:
    args = vars(build_parser().parse_args(argv))
    setup_logging(0)
    try:
        set_threads(args.pop("threads"))
        if args.pop("command") == "input":
            input_bench.run(args)
        else:
            train_bench.run(args)
    except UsageError as error:
        exit_with_usage_error("bench", error)
    finally:
        distributed.teardown()


if __name__ == "__main__":
    main(sys.argv[1:])
