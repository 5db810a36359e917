"""The training loop: optimizer, schedule, one epoch, evaluation, early stopping.

No host synchronisation inside a step: losses are summed on the device and read once per
epoch; the clock is read after a device synchronisation at the timing boundaries only.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn as nn

from workload import distributed
from workload.config import TrainConfig
from workload.distributed import DistInfo
from workload.logs import Progress, logger
from workload.precision import autocast, grad_scaler


def build_optimizer(model: nn.Module, cfg: TrainConfig, device: torch.device):
    # One fused kernel per step on GPUs; the multi-tensor (foreach) path on the CPU.
    fused = device.type == "cuda"
    return torch.optim.SGD(model.parameters(), lr=cfg.base_lr, momentum=cfg.momentum,
                           weight_decay=cfg.weight_decay, fused=fused or None,
                           foreach=None if fused else True)


def lr_factor(step: int, warmup_steps: int, total_steps: int) -> float:
    """Linear warm-up to 1, then cosine decay to 0 at `total_steps`."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
    return 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


def build_schedule(optimizer, cfg: TrainConfig, steps_per_epoch: int):
    total = planned_steps(cfg, steps_per_epoch)
    warmup = min(total, round(cfg.warmup_epochs * steps_per_epoch))
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_factor(step, warmup, total))


def planned_steps(cfg: TrainConfig, steps_per_epoch: int) -> int:
    total = cfg.epochs * steps_per_epoch
    return min(total, cfg.max_steps) if cfg.max_steps else total


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass
class TrainState:
    """Everything that changes while training (what a checkpoint must hold)."""
    model: nn.Module
    optimizer: torch.optim.Optimizer
    schedule: torch.optim.lr_scheduler.LRScheduler
    scaler: torch.amp.GradScaler
    epoch: int = 0
    step: int = 0
    batch: int = 0  # batches done in the current epoch: where a resumed run continues
    accuracies: list[float] = field(default_factory=list)


@dataclass
class EpochStats:
    train_loss: float
    steps: int
    epoch_time_s: float
    timed_images: int       # images of the steps inside the timing window (all ranks)
    timed_seconds: float    # the window: the run's very first step is left out as warm-up
    first_step_s: float | None = None

    @property
    def images_per_second(self) -> float:
        return self.timed_images / self.timed_seconds if self.timed_seconds > 0 else 0.0


class Trainer:
    def __init__(self, cfg: TrainConfig, info: DistInfo, state: TrainState, data, precision: str):
        self.cfg, self.info, self.state, self.data = cfg, info, state, data
        self.precision = precision
        self.loss_fn = nn.CrossEntropyLoss(label_smoothing=cfg.label_smoothing)
        self.total_steps = planned_steps(cfg, len(data.train))
        # Called after every optimizer step (checkpoints, preemption; see workload/resume.py).
        self.after_step: Callable[[], None] | None = None

    def train_step(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        state = self.state
        with autocast(self.precision, self.info.device):
            loss = self.loss_fn(state.model(images), labels)
        state.optimizer.zero_grad(set_to_none=True)
        state.scaler.scale(loss).backward()
        state.scaler.step(state.optimizer)
        state.scaler.update()
        state.schedule.step()
        state.step += 1
        return loss.detach()

    def train_epoch(self, epoch: int, start_batch: int = 0) -> EpochStats:
        state, device = self.state, self.info.device
        state.model.train()
        progress = Progress(len(self.data.train), f"epoch {epoch + 1}", self.info.is_main)
        loss_sum = torch.zeros((), device=device)
        steps, timed_images, first_step_s = 0, 0, None
        t_epoch = t_window = time.perf_counter()
        for batch, (images, labels) in enumerate(self.data.train.batches(epoch, start_batch),
                                                  start=start_batch + 1):
            if self.done_stepping():
                break
            loss_sum += self.train_step(images, labels)
            steps += 1
            state.batch = batch
            if self.after_step:
                self.after_step()
            if state.step == 1:  # the run's first step: warm-up (and compilation) time
                sync(device)
                t_window = time.perf_counter()
                first_step_s = t_window - t_epoch
            else:
                timed_images += len(labels)
            progress.update(batch)
        sync(device)
        progress.close()
        t_end = time.perf_counter()
        mean_loss = distributed.all_reduce_sum(loss_sum).item() / max(1, steps * self.info.world_size)
        all_images = int(distributed.all_reduce_sum(torch.tensor(float(timed_images), device=device)).item())
        return EpochStats(mean_loss, steps, t_end - t_epoch, all_images, t_end - t_window,
                          first_step_s)

    @torch.no_grad()
    def evaluate(self) -> tuple[float, float]:
        """Accuracy and mean loss over the whole test set, summed across ranks."""
        model, device = self.state.model, self.info.device
        model.eval()
        totals = torch.zeros(3, device=device, dtype=torch.float64)  # correct, loss sum, count
        for images, labels in self.data.test.batches(0):
            with autocast(self.precision, device):
                logits = model(images)
            totals[0] += (logits.argmax(1) == labels).sum()
            totals[1] += nn.functional.cross_entropy(logits.float(), labels, reduction="sum")
            totals[2] += len(labels)
        correct, loss_sum, count = distributed.all_reduce_sum(totals).tolist()
        return correct / max(1, count), loss_sum / max(1, count)

    def done_stepping(self) -> bool:
        return bool(self.cfg.max_steps) and self.state.step >= self.cfg.max_steps

    def reached_target(self) -> bool:
        """The reference's rule: the last `patience` epochs all at or above the target."""
        recent = self.state.accuracies[-self.cfg.patience:]
        return len(recent) == self.cfg.patience and min(recent) >= self.cfg.target_accuracy
