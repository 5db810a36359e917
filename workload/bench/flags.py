"""`bench`'s own flags and their checks (standard library only: `bench --help` and a bad
flag answer before torch is imported). The data, hardware and model flags are train's,
generated from the config (workload.config.add_flags)."""

from __future__ import annotations

import argparse

from workload.checkpoint.writer.diskfull import free_bytes
from workload.config import add_flags
from workload.errors import UsageError
from workload.files import output_file_problem, unwritable_reason

DEFAULT_BATCH_SIZES = "32,64,128,256"
# Settings that make no sense for a benchmark: no early stop, no output folder.
BENCH_FIXED = dict(epochs=1_000_000, output_dir="bench-unused")
BENCH_DEFAULTS = dict(dataset="synthetic", synthetic_size=10_000)


def add_common(p: argparse.ArgumentParser) -> None:
    add_flags(p, ("data", "hardware"))
    add_flags(p, ("training",), only={"batch_size", "seed"})
    add_flags(p, ("distributed",), only={"dist_timeout_s"})
    p.add_argument("--json", help="write the results and the fingerprint to this file")
    p.add_argument("--threads", type=int, default=0,
                   help="torch CPU threads for every run (0 = torch's default)")
    p.set_defaults(**BENCH_DEFAULTS)


def add_input(p: argparse.ArgumentParser) -> None:
    p.add_argument("--backends", help="comma-separated backends to measure (default: every "
                                      "available one and the reference)")
    p.add_argument("--batches", type=int, default=20, help="timed batches per run (20)")
    p.add_argument("--rounds", type=int, default=3,
                   help="runs per backend, alternating between backends (3); the median counts")
    p.add_argument("--versus-folder", metavar="DIR",
                   help="with --dataset shards: the image folder they were written from, "
                        "read beside them by each backend (with --stage-to, both also "
                        "staged); the baseline is the folder read by torch")
    p.add_argument("--read-only", action="store_true",
                   help="with --dataset imagefolder or shards: time reading the training "
                        "images alone, undecoded, in one thread (the backends' decoding "
                        "left out)")


def add_train(p: argparse.ArgumentParser) -> None:
    add_flags(p, ("model",))
    p.add_argument("--batch-sizes", default=DEFAULT_BATCH_SIZES,
                   help=f"comma-separated per-device batch sizes ({DEFAULT_BATCH_SIZES})")
    p.add_argument("--steps", type=int, default=10, help="timed steps per run (10)")
    p.add_argument("--warmup", type=int, default=2,
                   help="steps before timing starts, compilation included (2)")
    p.add_argument("--rounds", type=int, default=1,
                   help="runs per configuration, alternating between them (1); median counts")
    p.add_argument("--versus-reference", action="store_true",
                   help="the reference loop (fp32, TF32 on a GPU as NGC sets it, NCHW, per-sample "
                        "pipeline) against the "
                        "optimised one at --model/--batch-size (wrn, 64), side by side; "
                        "with --compile also the optimised one compiled")


def add_commit(p: argparse.ArgumentParser) -> None:
    p.add_argument("--size-mb", type=float, default=137.5,
                   help="the state's size in MB (137.5: the reference Wide ResNet's model "
                        "and SGD momentum)")
    p.add_argument("--rounds", type=int, default=9,
                   help="timed rounds of each, alternating (9); the medians count")
    p.add_argument("--dir", default=".",
                   help="the folder to write in, on the disk to measure (default: the "
                        "current folder; a temporary folder inside it is removed after)")
    p.add_argument("--json", help="write the results and the fingerprint to this file")


def check_commit(args: dict) -> None:
    """`bench commit`'s flags: one UsageError naming the first bad value."""
    if not args["size_mb"] > 0:
        raise UsageError(f"--size-mb must be more than 0, got {args['size_mb']}")
    if args["rounds"] < 1:
        raise UsageError(f"--rounds must be 1 or more, got {args['rounds']}")
    if problem := unwritable_reason(args["dir"]):
        raise UsageError(f"--dir {args['dir']} cannot be written ({problem}); pass a "
                         "folder on the disk to measure that you can write to")
    _check_commit_room(args)
    _check_json(args)


# What `bench commit` holds on its disk at once, in copies of the state: the commit being
# timed, the step before it (removed after the round) and the bare write's file.
COMMIT_COPIES = 3


def _check_commit_room(args: dict) -> None:
    free = free_bytes(args["dir"])
    needed = COMMIT_COPIES * args["size_mb"] * 1e6
    if free < needed:
        raise UsageError(
            f"--dir {args['dir']} has {free / 1e6:.1f} MB free, and bench commit --size-mb "
            f"{args['size_mb']:g} holds about {needed / 1e6:.1f} MB there at once (the "
            "commit, the step before it and the bare write); free space, pass --dir on a "
            "disk with room, or a smaller --size-mb")


def check(args: dict) -> None:
    """Every bench flag's rule: one UsageError naming the first bad value."""
    if args["threads"] < 0:
        raise UsageError(f"--threads must be 0 (torch's default) or more, got {args['threads']}")
    counts = ("batches", "rounds") if args["command"] == "input" else ("steps", "warmup", "rounds")
    for flag in counts:
        if args[flag] < 1:
            raise UsageError(f"--{flag} must be 1 or more, got {args[flag]}")
    if args["command"] == "train":
        parse_sizes(args["batch_sizes"])
    elif args["read_only"] and args["dataset"] not in ("imagefolder", "shards"):
        raise UsageError(f"--read-only times reading image files; --dataset "
                         f"{args['dataset']} is in memory: use --dataset imagefolder or shards")
    elif args["versus_folder"] and args["dataset"] != "shards":
        raise UsageError(f"--versus-folder {args['versus_folder']} compares shards with the "
                         "image folder they were written from: it goes with --dataset shards "
                         "--data-dir SHARDS")
    _check_json(args)


def _check_json(args: dict) -> None:
    if args["json"] and (problem := output_file_problem(args["json"])):
        raise UsageError(f"--json {args['json']} cannot be written ({problem}); pass a file "
                         "path in a folder you can write to")


def parse_sizes(text: str) -> list[int]:
    try:
        sizes = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) < 1:
        raise UsageError(f"--batch-sizes {text!r} is not a list of positive integers; "
                         "pass e.g. --batch-sizes 32,64,128,256")
    return sizes
