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
import os
import sys
import time

import torch

from workload import distributed, resume
from workload.caches import ensure_writable_caches
from workload.config import (DATA_BACKENDS, DATASETS, DEVICES, LR_SCALINGS, PRECISIONS,
                             STRATEGIES, TrainConfig, build_config)
from workload.data import build_data
from workload.distributed import resolve_device
from workload.errors import UsageError, exit_with_usage_error
from workload.logs import logger, setup_logging
from workload.models import MODELS, build_model, count_parameters
from workload.preemption import (PREEMPT_SIGNALS, REQUEUE_EXIT_STATUS, Preempted,
                                 PreemptionFlag)
from workload.precision import (configure_cudnn, configure_tf32, grad_scaler,
                                resolve_precision)
from workload.records import (append_jsonl, model_sha256, prepare_output_dir, versions,
                              write_json)
from workload.resume import Checkpointer
from workload.tensorboard import NoBoard, open_board
from workload.trainer import (EpochStats, Trainer, TrainState, build_optimizer,
                              build_schedule)


def build_parser() -> argparse.ArgumentParser:
    """Flags left at None were not given: a recipe or the TrainConfig default fills them."""
    p = argparse.ArgumentParser(prog="train", description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n".join(__doc__.split("\n")[2:]))
    add_model_arguments(p)
    add_data_arguments(p)
    run = p.add_argument_group("training (the first five as in the reference train.py)")
    run.add_argument("--batch-size", type=int, help="images per step per process (256)")
    run.add_argument("--epochs", type=int, help="passes over the training set (100)")
    run.add_argument("--base-lr", type=float, help="peak learning rate (0.01)")
    run.add_argument("--target-accuracy", type=float, help="early-stop accuracy (0.95)")
    run.add_argument("--patience", type=int, help="epochs at the target before stopping (2)")
    run.add_argument("--max-steps", type=int, help="stop after N steps; 0 = no limit")
    run.add_argument("--momentum", type=float, help="SGD momentum (0.9)")
    run.add_argument("--weight-decay", type=float, help="SGD weight decay (5e-4)")
    run.add_argument("--warmup-epochs", type=float, help="linear LR warm-up (1 epoch)")
    run.add_argument("--label-smoothing", type=float, help="0 = off (default)")
    run.add_argument("--seed", type=int, help="same seed, same result on the CPU (0)")
    add_hardware_arguments(p)
    par = p.add_argument_group("several processes (see README: Running on a cluster)")
    par.add_argument("--strategy", choices=STRATEGIES,
                     help="ddp: a replica per process (default); fsdp: FSDP2 sharding")
    par.add_argument("--lr-scaling", choices=LR_SCALINGS,
                     help="linear: base lr x number of processes; none: as given (default)")
    par.add_argument("--dist-timeout", type=float, dest="dist_timeout_s",
                     help="seconds a rank may wait in a collective (600)")
    p.add_argument("--output-dir", help="run folder (default: runs/<timestamp>)")
    p.add_argument("--tensorboard", action="store_true", default=None,
                   help="also write TensorBoard event files into <output-dir>/tensorboard")
    ckpt = p.add_argument_group("checkpoints, resume and preemption")
    ckpt.add_argument("--resume", metavar="auto|never|PATH",
                      help="auto (default): continue from the newest good checkpoint in the "
                           "output dir; never: start afresh; or a checkpoint folder")
    ckpt.add_argument("--overwrite", action="store_true", default=None,
                      help="with --resume never: replace the output dir's checkpoints")
    ckpt.add_argument("--checkpoint-every", metavar="N|DURATION",
                      help="also save every N steps or every 10m / 90s / 1h (default 30m); "
                           "0 = epoch ends only")
    ckpt.add_argument("--keep-checkpoints", type=int, help="complete checkpoints kept (3)")
    ckpt.add_argument("--preempt-signal", choices=PREEMPT_SIGNALS,
                      help="signal that asks for a checkpoint and the requeue exit status "
                           f"{REQUEUE_EXIT_STATUS} (default USR2; SIGTERM always does)")
    return p


def add_model_arguments(p: argparse.ArgumentParser) -> None:
    """The model flags, shared with `bench`."""
    model = p.add_argument_group("model")
    model.add_argument("--model", choices=MODELS, help="network (default: wrn, the reference)")
    model.add_argument("--width", type=int, help="wrn: width of the first stage (default 160)")
    model.add_argument("--blocks-per-stage", type=int, help="wrn: residual blocks per stage (2)")
    model.add_argument("--dropout", type=float, help="wrn: dropout inside blocks (0.01)")


def add_data_arguments(p: argparse.ArgumentParser) -> None:
    """The dataset flags, shared with `bench`."""
    data = p.add_argument_group("data")
    data.add_argument("--dataset", choices=DATASETS, help="default: cifar100")
    data.add_argument("--data-dir", help="dataset folder (default: ./data)")
    data.add_argument("--download", action="store_true", default=None,
                      help="fetch CIFAR-100 first (needs internet)")
    data.add_argument("--image-size", type=int, help="image side; 0 = the dataset's own")
    data.add_argument("--synthetic-size", type=int, help="synthetic: training images (10000)")
    data.add_argument("--num-classes", type=int, help="synthetic: classes (100)")
    data.add_argument("--workers", type=int,
                      help="DataLoader processes / DALI threads; -1 = from SLURM_CPUS_PER_TASK")
    data.add_argument("--data-backend", choices=DATA_BACKENDS,
                      help="auto (default: device for in-memory sets, dali for image folders "
                           "on a GPU, else torch), device, dali or torch")


def add_hardware_arguments(p: argparse.ArgumentParser) -> None:
    """The device and numerics flags, shared with `bench`."""
    hw = p.add_argument_group("hardware")
    hw.add_argument("--device", choices=DEVICES, help="default: auto (CUDA when visible)")
    hw.add_argument("--precision", choices=PRECISIONS,
                    help="default: auto = bf16 on GPUs that support it, else fp32")
    hw.add_argument("--channels-last", action=argparse.BooleanOptionalAction, default=None,
                    help="NHWC memory format (default: on with CUDA, off on the CPU)")
    hw.add_argument("--compile", action="store_true", default=None, help="torch.compile")


def parse_config(argv: list[str] | None) -> TrainConfig:
    args = vars(build_parser().parse_args(argv))
    device = resolve_device(args["device"] or TrainConfig.device)
    return build_config(args, device.type)


def log_start(cfg: TrainConfig, info, data, model, precision: str) -> None:
    if cfg.recipe:
        logger.info(f"recipe {cfg.recipe}: model {cfg.model} width {cfg.width} "
                    f"blocks {cfg.blocks_per_stage}, batch {cfg.batch_size}, "
                    f"{cfg.epochs} epochs, base lr {cfg.base_lr}")
    logger.info(f"{cfg.model} ({count_parameters(model) / 1e6:.2f} M parameters) on "
                f"{cfg.dataset} ({data.num_train_samples} training images, "
                f"{data.num_classes} classes), device {info.device}, precision {precision}, "
                f"world size {info.world_size} ({info.layout})")
    logger.info(f"data backend {data.backend}: {data.reason}")
    logger.info("versions: " + ", ".join(f"{k} {v}" for k, v in versions().items()))


def epoch_record(epoch: int, stats: EpochStats, accuracy: float, test_loss: float,
                 lr: float) -> dict:
    return dict(epoch=epoch + 1, train_loss=stats.train_loss, test_loss=test_loss,
                accuracy=accuracy, epoch_time_s=stats.epoch_time_s,
                images_per_second=stats.images_per_second, steps=stats.steps, lr=lr)


def log_epoch(cfg: TrainConfig, record: dict) -> None:
    logger.info(f"epoch {record['epoch']}/{cfg.epochs}: loss {record['train_loss']:.4f}, "
                f"test loss {record['test_loss']:.4f}, accuracy {record['accuracy']:.4f}, "
                f"time {record['epoch_time_s']:.2f}s, {record['images_per_second']:.1f} img/s")


def fit(trainer: Trainer, out, checkpointer: Checkpointer | None = None,
        board=NoBoard()) -> dict:
    """Train epoch by epoch until the epochs, the step limit or the early-stop rule ends it."""
    cfg, state, info = trainer.cfg, trainer.state, trainer.info
    timed_images, timed_seconds, first_step_s, stopped_early = 0, 0.0, None, False
    while state.epoch < cfg.epochs and not trainer.done_stepping():
        stats = trainer.train_epoch(state.epoch, state.batch)
        accuracy, test_loss = trainer.evaluate()
        state.accuracies.append(accuracy)
        record = epoch_record(state.epoch, stats, accuracy, test_loss,
                              state.schedule.get_last_lr()[0])
        state.epoch, state.batch = state.epoch + 1, 0
        timed_images += stats.timed_images
        timed_seconds += stats.timed_seconds
        first_step_s = first_step_s or stats.first_step_s
        if info.is_main:
            log_epoch(cfg, record)
            append_jsonl(out / "metrics.jsonl", record)
            board.log_epoch(record)
        if checkpointer:
            checkpointer.after_epoch()
        if trainer.reached_target():
            logger.info(f"target accuracy {cfg.target_accuracy} reached for "
                        f"{cfg.patience} epochs: stopping after epoch {state.epoch}")
            stopped_early = True
            break
    return dict(
        final_accuracy=state.accuracies[-1] if state.accuracies else None,
        best_accuracy=max(state.accuracies, default=None),
        epochs_run=state.epoch, steps_run=state.step, stopped_early=stopped_early,
        images_per_second=timed_images / timed_seconds if timed_seconds else 0.0,
        first_step_s=first_step_s,
    )


def seed_everything(seed: int) -> None:
    torch.manual_seed(seed)


def run(cfg: TrainConfig, flag: PreemptionFlag | None = None) -> dict:
    """Train as configured; `flag` is set by the preemption signal handlers (see main)."""
    started = time.perf_counter()
    info = distributed.init_distributed(cfg.device, cfg.dist_timeout_s)
    setup_logging(info.rank)
    for variable, folder in ensure_writable_caches().items():
        logger.warning(f"{variable} is not writable by this user (a shared /tmp?); using {folder}")
    precision = resolve_precision(cfg.precision, info.device)
    configure_tf32(precision)
    configure_cudnn(info.device)
    seed_everything(cfg.seed)
    data = build_data(cfg, info.device, info.rank, info.world_size, info.local_world_size)
    out = prepare_output_dir(cfg.output_dir)
    resume.prepare(cfg, out, info.is_main)
    model = build_model(cfg.model, data.num_classes, cfg.width, cfg.blocks_per_stage,
                        cfg.dropout).to(info.device)
    if cfg.channels_last:
        model = model.to(memory_format=torch.channels_last)
    log_start(cfg, info, data, model, precision)
    if info.is_main:
        write_json(out / "config.json", cfg.to_dict())
    model = distributed.wrap_model(model, info, cfg.strategy)
    optimizer = build_optimizer(model, cfg, info.device)
    lr_multiplier = distributed.lr_scale(cfg.lr_scaling, info.world_size)
    for group in optimizer.param_groups:  # before the schedule records its base lr
        group["lr"] *= lr_multiplier
    state = TrainState(model, optimizer, build_schedule(optimizer, cfg, len(data.train)),
                       grad_scaler(precision, info.device))
    if cfg.compile:
        state.model = torch.compile(model)
    resume.resume(cfg, info, state, out)
    trainer = Trainer(cfg, info, state, data, precision)
    checkpointer = Checkpointer(cfg, info, state, out, len(data.train), flag or PreemptionFlag())
    trainer.after_step = checkpointer.after_step
    with open_board(cfg.tensorboard and info.is_main, out) as board:
        summary = fit(trainer, out, checkpointer, board)
    summary.update(total_time_s=time.perf_counter() - started, world_size=info.world_size,
                   device=str(info.device), precision=precision, model=cfg.model,
                   dataset=cfg.dataset, parameters=count_parameters(model),
                   model_sha256=model_sha256(model), versions=versions(),
                   **distributed.describe(info, cfg.strategy, cfg.lr_scaling,
                                          cfg.base_lr * lr_multiplier, cfg.batch_size))
    if info.is_main:
        write_json(out / "summary.json", summary)
        logger.info(f"done: accuracy {summary['final_accuracy']:.4f} (best "
                    f"{summary['best_accuracy']:.4f}), {summary['images_per_second']:.1f} "
                    f"img/s, {summary['total_time_s']:.1f}s; summary in {out / 'summary.json'}")
    return summary


def main(argv: list[str] | None = None) -> None:
    try:
        cfg = parse_config(argv)
        # Installed first, so a preemption signal during start-up is not fatal either.
        flag = PreemptionFlag().install(("TERM", cfg.preempt_signal))
        try:
            run(cfg, flag)
        finally:
            flag.uninstall()
    except UsageError as error:
        exit_with_usage_error("train", error)
    except Preempted as stop:
        logger.warning(f"{stop}: checkpoint written; exiting with status "
                       f"{REQUEUE_EXIT_STATUS} so the job script requeues the job")
        sys.exit(REQUEUE_EXIT_STATUS)
    finally:
        distributed.teardown()


if __name__ == "__main__":
    main()
