"""The one start of a process, shared by `train`, `evaluate` and `bench`: the launch
variables, the device, the process group with --dist-timeout, logging, the user's own
cache folders checked (the command chose the others before torch was imported:
workload/caches.py), numerics and the seed, and the group left on the way out
(`start_process`).

The one build path of a training state, shared by `train` and `bench`:
model -> device and memory format -> DDP/FSDP wrapping -> optimizer (learning rate scaled
for the number of processes) -> schedule -> gradient scaler -> torch.compile.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from collections.abc import Iterator

import torch
import torch.nn as nn

from workload import distributed
from workload.config import TrainConfig
from workload.distributed import DistInfo
from workload.launch import PreemptionFlag
from workload.caches import user_cache_problems
from workload.logs import logger, setup_logging
from workload.models import load_initial_weights, model_for, residual_blocks
from workload.precision import (configure_cudnn, configure_tf32, grad_scaler, resolve_precision,
                                switches_kept)
from workload.training.step_graph import CompiledOptimizerStep, compiles_step
from workload.training.trainer import TrainState


@contextmanager
def start_process(cfg: TrainConfig, flag: PreemptionFlag | None,
                  timeout_s: float | None = None) -> Iterator[tuple[DistInfo, str]]:
    """Join the job as `cfg` says, set up logging, caches, numerics and the seed; yields
    where this process sits and the precision to use. The process group is left on every
    way out (a bad launch value is a UsageError before any group forms). `flag`: the
    command's, which a signal while the ranks meet is acted on by (init_distributed).
    `timeout_s`: the collectives' timeout at start (train's --dist-start-timeout; else
    --dist-timeout)."""
    with process_settings_kept():
        info = distributed.init_distributed(cfg.hardware.device,
                                            timeout_s or cfg.distributed.dist_timeout_s, flag)
        with joined(cfg, info) as precision:
            yield info, precision


@contextmanager
def process_settings_kept() -> Iterator[None]:
    """What a start changes for the whole process put back when the command returns or
    raises, for a program that runs train (or evaluate, bench) in its own process: torch's
    thread count, the TF32 and cuDNN switches and the CPU random state (the logger is
    commands.run_command's; the cache variables chosen at the command's start stay: their
    folders are the command's own)."""
    threads = torch.get_num_threads()
    try:
        with switches_kept(), torch.random.fork_rng(devices=[]):
            yield
    finally:
        torch.set_num_threads(threads)


@contextmanager
def joined(cfg: TrainConfig, info: DistInfo) -> Iterator[str]:
    """Logging, caches, numerics and the seed of a process that has joined; the process
    group left on every way out."""
    try:
        setup_logging(info.rank)
        for problem in user_cache_problems().values():  # the folders the user chose
            logger.warning(problem)
        precision = resolve_precision(cfg.hardware.precision, info.device)
        configure_tf32(precision)
        hw = cfg.hardware
        configure_cudnn(info.device, hw.cudnn_benchmark, hw.cudnn_benchmark_limit)
        torch.manual_seed(cfg.training.seed)
        yield precision
    finally:
        distributed.teardown()


def lr_scale(mode: str, world_size: int) -> float:
    """Learning-rate factor for the global batch (batch size x processes).

    Data parallelism multiplies the images per optimizer step by the number of processes;
    to train like a single process on the same global batch, scale the learning rate with
    it ("linear"), or keep it ("none") and accept the different dynamics.
    """
    return float(world_size) if mode == "linear" else 1.0


def build_optimizer(model: nn.Module, cfg: TrainConfig, device: torch.device):
    # One fused kernel per step on GPUs; the multi-tensor (foreach) path on the CPU and
    # in a compiled step (which Inductor fuses itself: torch.compile traces foreach SGD).
    fused = device.type == "cuda" and not compiles_step(cfg.hardware)
    t = cfg.training
    return torch.optim.SGD(model.parameters(), lr=t.base_lr, momentum=t.momentum,
                           weight_decay=t.weight_decay, fused=fused or None,
                           foreach=None if fused else True)


def lr_factor(step: int, warmup_steps: int, total_steps: int) -> float:
    """Linear warm-up to 1, then cosine decay to 0 at `total_steps`."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
    return 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


def planned_steps(cfg: TrainConfig, steps_per_epoch: int) -> int:
    """The steps this run will take (the progress lines' total)."""
    total = cfg.training.epochs * steps_per_epoch
    return min(total, cfg.training.max_steps) if cfg.training.max_steps else total


def build_schedule(optimizer, cfg: TrainConfig, steps_per_epoch: int):
    # Planned over --epochs: --max-steps only stops the run where it is, so a run stopped
    # by it and continued with a larger one follows the schedule of one run without it.
    total = cfg.training.epochs * steps_per_epoch
    warmup = min(total, round(cfg.training.warmup_epochs * steps_per_epoch))
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_factor(step, warmup, total))


def place_model(cfg: TrainConfig, info: DistInfo, num_classes: int) -> nn.Module:
    """The configured model on this rank's device, in its memory format, wrapped for the
    job (DDP or FSDP2; itself when alone)."""
    with torch.device(info.device):  # built there: no copy of each weight from the CPU
        model = model_for(cfg, num_classes)
    if cfg.model.init_from:  # before wrapping: every rank loads the same file
        logger.info(load_initial_weights(model, cfg.model.init_from,
                                         cfg.model.init_reinit_head))
    model = model.to(info.device)  # a model (or buffer) made outside the context
    if cfg.hardware.channels_last:
        model = model.to(memory_format=torch.channels_last)
    return distributed.wrap_model(model, info, cfg.distributed.strategy)


def build_state(cfg: TrainConfig, info: DistInfo, num_classes: int, steps_per_epoch: int,
                precision: str) -> TrainState:
    """Everything that changes while training, ready for the first step (or a resume)."""
    model = place_model(cfg, info, num_classes)
    optimizer = build_optimizer(model, cfg, info.device)
    scale = lr_scale(cfg.distributed.lr_scaling, info.world_size)
    for group in optimizer.param_groups:  # before the schedule records its base lr
        group["lr"] *= scale
    state = TrainState(model, optimizer, build_schedule(optimizer, cfg, steps_per_epoch),
                       grad_scaler(precision, info.device))
    if cfg.hardware.compile:
        state.model = compiled(model, cfg.hardware.compile_mode, cfg.hardware.compile_scope)
    if compiles_step(cfg.hardware):
        CompiledOptimizerStep(optimizer, cfg.hardware.compile_mode)
    return state


def compiled(model: nn.Module, mode: str, scope: str) -> nn.Module:
    """torch.compile in `mode`, over the whole model or each residual block on its own.
    Blocks compile in place (their state_dict keys unchanged, so checkpoints are the
    eager model's); each is a region of its own in which Inductor fuses BatchNorm, ReLU
    and the residual add, forward and backward, and blocks of one shape share the code.
    Static shapes: a block of another width is another graph, never a dynamic one."""
    if scope in ("model", "step"):  # the step's forward compiles with its loss (Trainer)
        return torch.compile(model, mode=mode)
    for block in residual_blocks(distributed.unwrap(model)):
        block.compile(mode=mode, dynamic=False)
    return model
