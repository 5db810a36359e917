"""`train`: the reference Wide ResNet (or any torchvision model) on CIFAR-100, digits,
synthetic data or your own image folders, on one device, several GPUs or several nodes.

Quick start on any machine (CPU, no network; under 30 seconds on 2 idle cores):
    train --dataset digits --device cpu

One GPU, the Olivia guide's job line:
    apptainer exec --nv image.sif train --dataset cifar100 --data-dir $DATA \\
        --batch-size 256 --epochs 100 --base-lr 0.01 --target-accuracy 0.95 --patience 2

Your own images, staged to node-local disk, from local weights (docs/your-data.md):
    srun train --dataset imagefolder --data-dir $PROJECT/pets.tar --stage-to $SLURM_TMPDIR \\
        --model resnet50 --init-from resnet50.safetensors --init-reinit-head

A large image folder as tar shards (written once), then trained from:
    train --dataset imagefolder --data-dir $PROJECT/pets --prepare-data --shards $PROJECT/shards
    srun train --dataset shards --data-dir $PROJECT/shards --model resnet50

Fetch or check the data only (a login node), and run a recorded run again:
    train --dataset cifar100 --data-dir $PROJECT/data --download --prepare-data
    train --config runs/A/config.json --output-dir runs/B

Smoke run:
    train --dataset synthetic --synthetic-size 512 --model wrn --width 16 --max-steps 5
"""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn

from workload.caches import use_private_caches
from workload.checkpoint import check_local
from workload.checkpoint.writer.diskfull import write_problem
from workload.commands import TRAIN_ENDING_SIGNALS, command_parser, run_command
from workload.config import (FILE_DATASETS, TrainConfig, add_flags, build_config, flag_of,
                             given, read_config_file, repeatable, resolve_stem)
from workload.errors import UsageError
from workload.launch.ending import end_process
from workload.launch.preemption import StartUpFlag
from workload.logs import say, warn
from workload.training.startup import start_cuda_context

PROG = "train"


def build_parser() -> argparse.ArgumentParser:
    """Every flag comes from a config field; left out, it is None: a recipe or the field's
    default fills it."""
    parser = command_parser(PROG, __doc__)
    parser.add_argument("--config", metavar="FILE",
                        help="take every setting from this JSON (or .toml) file, such as a "
                             "run's config.json; flags given here override it")
    add_flags(parser)
    return parser


def parse_config(argv: list[str] | None) -> TrainConfig:
    """Parse and validate with the standard library only, so `--help` and every usage error
    answer before torch is imported; then the cache folders are chosen (workload/caches.py)
    and the device decides the recipe."""
    args = build_parser().parse_args(argv)
    values = {k: v for k, v in given(args).items() if v is not None}
    if args.config:
        values = {**settings_of(args.config), **values}
    build_config(values)  # validates what was given over the plain defaults
    check_local(values.get("checkpoint_local") or "",
                values.get("output_dir") or TrainConfig().logging.output_dir)
    # Before torch is imported: torchvision's import fixes Inductor's cache folder.
    use_private_caches(PROG)
    from workload.distributed import resolve_device
    from workload.models import check_model_name

    check_model_name(values.get("model") or TrainConfig().model.name)
    device = resolve_device(values.get("device") or TrainConfig().hardware.device)
    cfg = build_config(values, device.type)
    return cfg.replace(stem=resolve_stem(cfg))  # config.json records the stem used


def settings_of(path: str) -> dict:
    """A --config file's settings; its one-shot actions (another run's --overwrite) are
    ignored with a warning: given again as flags, they act."""
    values, ignored = repeatable(read_config_file(path))
    if ignored:
        warn(PROG, f"--config {path}: ignoring {', '.join(flag_of(k) for k in ignored)}: "
                   "they act once, when given on the command line, and are not repeated "
                   "from a file")
    return values


def train(argv: list[str] | None, early: StartUpFlag | None = None,
          keep_signal_handlers: bool = False) -> dict:
    """Train as `argv` says; `early`: run_command's StartUpFlag, which answered the signals
    from the first line and hands what it recorded over to train's own flag."""
    cfg = parse_config(argv)
    start_cuda_context(cfg.hardware.device)  # while the rest imports (training/startup.py)
    warn_container_paths(cfg)
    from workload.checkpoint import Preempted
    from workload.launch import PreemptionFlag
    from workload.training.run import run

    # Installed first, so a preemption signal during start-up is not fatal either. Ctrl-C
    # (SIGINT) is a preemption too: a checkpoint, then the requeue status; twice: stop now.
    flag = PreemptionFlag().install(("TERM", "INT", cfg.checkpoint.preempt_signal))
    if cfg.checkpoint.preempt_signal != "USR1":
        flag.ignore("USR1")  # until the run's stack dump takes it over (training/run.py)
    if early is not None:
        early.take_over(flag)
    try:
        return run(cfg, flag)
    except Preempted as stop:
        leave_for_requeue(stop, flag.signal_name)
    except KeyboardInterrupt:
        say(f"{PROG}: interrupted twice: stopped without a checkpoint; the run resumes from "
            "its last one", sys.stderr)
        sys.exit(130)  # 128 + SIGINT, as a shell reports it
    except RuntimeError as error:
        point_to_diagnose(error, cfg)
        raise
    except OSError as error:
        line = write_problem(error.errno, error.filename or cfg.logging.output_dir)
        if line is None:
            raise
        raise UsageError(line) from None
    finally:
        if not keep_signal_handlers:
            # In this order: unregistering the dump puts back what SIGUSR1 had when it was
            # registered (ignored since start-up), and uninstall then what it had before.
            forget_dump_signal()
            flag.uninstall()


def forget_dump_signal() -> None:
    """The stack dump on SIGUSR1 that the run registered, taken back (its file closed): in
    a program that called train, the signal would still write into this run's folder."""
    import faulthandler

    from workload.launch.diagnostics import DUMP_SIGNAL

    faulthandler.unregister(DUMP_SIGNAL)


def warn_container_paths(cfg: TrainConfig) -> None:
    """Relative output/data folders that pyxis would put inside the container (rank 0)."""
    import os

    from workload.launch.variables import outside_submit_dir

    paths = {"--output-dir": cfg.logging.output_dir}
    if cfg.data.dataset in FILE_DATASETS:
        paths["--data-dir"] = cfg.data.data_dir
    if os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0")) == "0":
        for warning in outside_submit_dir(paths, os.environ, os.getcwd()):
            warn("train", warning)


# What a collective's failure says when a peer hung or died (gloo raises a plain RuntimeError).
COLLECTIVE_FAILURES = ("timed out", "timeout", "connection reset", "connection closed",
                       "gloo", "nccl")


def point_to_diagnose(error: RuntimeError, cfg: TrainConfig) -> None:
    """A collective that timed out or lost a peer: the command that names the rank."""
    from torch.distributed import DistError

    text = str(error).lower()
    if isinstance(error, DistError) or any(word in text for word in COLLECTIVE_FAILURES):
        say(f"{PROG}: a collective failed ({type(error).__name__}); to see which rank held "
            f"the others up and where: diagnose {cfg.logging.output_dir}", sys.stderr)


def leave_for_requeue(stop: Exception, signal_name: str | None) -> None:
    """The preempted run's last line in the log, then the requeue status; after SLURM's
    SIGTERM with no job script to requeue the job, a wait for SLURM to end the step
    instead (the launch layer's exit_for_requeue makes the same choice for a user's own
    script; workload/launch/preemption.py says why)."""
    from workload.launch.preemption import (REQUEUE_EXIT_STATUS, slurm_will_requeue,
                                            wait_for_slurm)
    from workload.logs import logger

    if slurm_will_requeue(signal_name):
        logger.warning(f"{stop}: checkpoint written")
        wait_for_slurm()
    logger.warning(f"{stop}: checkpoint written; exiting with status {REQUEUE_EXIT_STATUS} "
                   "so the job script requeues the job")
    sys.exit(REQUEUE_EXIT_STATUS)


def main(argv: list[str] | None = None) -> int:
    """Train in this process (the tests do): its signal handlers are restored afterwards."""
    return run_command(PROG, lambda early: train(argv, early), TRAIN_ENDING_SIGNALS)


def cli() -> NoReturn:
    """The `train` program; it ends the process (workload.launch.ending says why). Its
    preemption handlers stay until the process ends: a signal that comes after the last
    step (while the process group is torn down and the process ends) finds nothing left to
    save, and must not kill a finished run and fail its job."""
    end_process(lambda: run_command(
        PROG, lambda early: train(None, early, keep_signal_handlers=True),
        TRAIN_ENDING_SIGNALS, keep_signals=True))


if __name__ == "__main__":
    cli()
