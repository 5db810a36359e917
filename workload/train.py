"""`train`: the reference Wide ResNet (and ResNets) on CIFAR-100, digits, synthetic data or
your own image folders, on one device, several GPUs or several nodes.

Quick start on any machine (CPU, no network; about two minutes on 2 cores):
    train --dataset digits --device cpu

One GPU, the Olivia guide's job line:
    apptainer exec --nv image.sif train --dataset cifar100 --data-dir $DATA \\
        --batch-size 256 --epochs 100 --base-lr 0.01 --target-accuracy 0.95 --patience 2

Smoke run:
    train --dataset synthetic --synthetic-size 512 --model wrn --width 16 --max-steps 5
"""

from __future__ import annotations

import argparse
import sys

from workload.commands import command_parser, run_command
from workload.config import TrainConfig, add_flags, build_config, given

PROG = "train"


def build_parser() -> argparse.ArgumentParser:
    """Every flag comes from a config field; left out, it is None: a recipe or the field's
    default fills it."""
    parser = command_parser(PROG, __doc__)
    add_flags(parser)
    return parser


def parse_config(argv: list[str] | None) -> TrainConfig:
    """Parse and validate with the standard library only, so `--help` and every usage error
    answer before torch is imported; then the device decides the recipe."""
    values = given(build_parser().parse_args(argv))
    build_config(values)  # validates what was given over the plain defaults
    from workload.distributed import resolve_device

    device = resolve_device(values.get("device") or TrainConfig().hardware.device)
    return build_config(values, device.type)


def train(argv: list[str] | None) -> dict:
    cfg = parse_config(argv)
    warn_container_paths(cfg)
    from workload.checkpoint import PreemptionFlag, Preempted
    from workload.training.run import run

    # Installed first, so a preemption signal during start-up is not fatal either.
    flag = PreemptionFlag().install(("TERM", cfg.checkpoint.preempt_signal))
    try:
        return run(cfg, flag)
    except Preempted as stop:
        exit_for_requeue(stop)
    finally:
        flag.uninstall()


def warn_container_paths(cfg: TrainConfig) -> None:
    """Relative output/data folders that pyxis would put inside the container (rank 0)."""
    import os

    from workload.launch.paths import outside_submit_dir

    paths = {"--output-dir": cfg.logging.output_dir}
    if cfg.data.dataset not in ("digits", "synthetic"):  # these read no files
        paths["--data-dir"] = cfg.data.data_dir
    if os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0")) == "0":
        for warning in outside_submit_dir(paths, os.environ, os.getcwd()):
            print(f"train: warning: {warning}", file=sys.stderr)


def exit_for_requeue(stop: Exception) -> None:
    from workload.checkpoint import REQUEUE_EXIT_STATUS
    from workload.logs import logger

    logger.warning(f"{stop}: checkpoint written; exiting with status {REQUEUE_EXIT_STATUS} "
                   "so the job script requeues the job")
    sys.exit(REQUEUE_EXIT_STATUS)


def main(argv: list[str] | None = None) -> None:
    run_command(PROG, lambda: train(argv))


if __name__ == "__main__":
    main()
