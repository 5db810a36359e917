"""The training loop: epochs of steps, evaluation, early stopping, and the hooks that
checkpointing and logging attach to (passed in, called after every step and epoch).

The test-set evaluation (`evaluate_model`) has one home here for `train` (after every
epoch) and `evaluate`: the same batches, precision and sums, so `evaluate` on a run's own
data gives its final accuracy.

No host synchronisation inside a step: losses are summed on the device and read once per
epoch; the loop's probe (workload.training.probe) is its one clock, and the loop writes no
output: the progress line, the terminal bar and the logs are hooks. The
summed loss is also read every FINITE_CHECK_EVERY steps: a loss that became NaN or infinite
stops the run (unless --allow-nonfinite-loss) instead of burning the allocation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from collections.abc import Callable
from typing import Protocol

import torch
import torch.nn as nn

from workload import distributed
from workload.commands import start_up_over
from workload.config import TrainConfig
from workload.distributed import DistInfo
from workload.errors import UsageError
from workload.logs import logger
from workload.precision import autocast
from workload.training.probe import StepProbe, Window
from workload.training.step_graph import forward_and_loss
from workload.training.watchdog import CHECKPOINT, COLLECTIVE, EVALUATION


# Steps between two reads of the summed training loss (one host synchronisation each).
FINITE_CHECK_EVERY = 50


class Stateful(Protocol):
    """A part of the training state that saves and restores itself (TrainState.parts).
    `state_dict` is this rank's own call, never a collective. A part whose state sums
    every rank's has that collective apart, `gather_across_ranks`, which every rank's
    checkpoint calls on it before `state_dict` (the energy's)."""

    def state_dict(self) -> dict: ...

    def load_state_dict(self, saved: dict | None) -> None: ...


class NonFiniteLoss(UsageError):
    """The training loss became NaN or infinite: the run diverged."""


@dataclass(frozen=True)
class Evaluation:
    accuracy: float
    loss: float      # mean cross-entropy per image
    images: int      # over every rank
    correct: int


@torch.no_grad()
def evaluate_model(model: nn.Module, test_loader, precision: str,
                   device: torch.device) -> Evaluation:
    """Accuracy and mean loss over the whole test set, summed across ranks (every rank
    calls it: it ends with a collective)."""
    start_up_over()  # `evaluate`'s loop (a training's evaluations find it over already)
    model.eval()
    totals = torch.zeros(3, device=device, dtype=torch.float64)  # correct, loss sum, count
    for images, labels in test_loader.batches(0):
        with autocast(precision, device):
            logits = model(images)
        totals[0] += (logits.argmax(1) == labels).sum()
        totals[1] += nn.functional.cross_entropy(logits.float(), labels, reduction="sum")
        totals[2] += len(labels)
    correct, loss_sum, count = distributed.all_reduce_sum(totals).tolist()
    return Evaluation(correct / max(1, count), loss_sum / max(1, count), int(count),
                      int(correct))


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
    # What a checkpoint carries besides the above: objects with `state_dict` (JSON data,
    # saved under its name in trainer.json; `gather_across_ranks` first where it sums the
    # ranks': Stateful) and `load_state_dict` (given that data back, or None from a
    # checkpoint without it), as torchtitan's checkpointer takes them: the run's energy.
    parts: dict[str, Stateful] = field(default_factory=dict)


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


@dataclass
class StepDone:
    """What a step hook is shown: where the loop is and the step's loss, still on the
    device (reading it, `.item()`, waits for the device: a hook does so only when it logs)."""
    epoch: int
    batch: int
    step: int
    images: int  # this rank's images in the step
    loss: torch.Tensor


@dataclass
class Hooks:
    """What runs beside the loop, which writes no output of its own: after every
    optimizer step (checkpoints, preemption; then the progress hooks, shown the step: the
    interval exchange, the progress line, the terminal bar), where an epoch's steps end
    (the bar's line cleared), where --max-steps stops an epoch partway (its checkpoint,
    before the evaluation) and after every epoch, with the epoch's record (logs,
    metrics.jsonl, TensorBoard, the epoch-end checkpoint), in list order."""
    after_step: list[Callable[[], None]] = field(default_factory=list)
    after_epoch: list[Callable[[dict], None]] = field(default_factory=list)
    progress: list[Callable[[StepDone], None]] = field(default_factory=list)
    at_step_limit: list[Callable[[], None]] = field(default_factory=list)
    epoch_end: list[Callable[[], None]] = field(default_factory=list)


def epoch_record(epoch: int, stats: EpochStats, accuracy: float, test_loss: float,
                 lr: float) -> dict:
    """One line of metrics.jsonl."""
    return dict(epoch=epoch + 1, train_loss=stats.train_loss, test_loss=test_loss,
                accuracy=accuracy, epoch_time_s=stats.epoch_time_s,
                images_per_second=stats.images_per_second, steps=stats.steps, lr=lr)


class Trainer:
    def __init__(self, cfg: TrainConfig, info: DistInfo, state: TrainState, data,
                 precision: str, hooks: Hooks | None = None, probe: StepProbe | None = None):
        self.cfg = cfg
        self.info = info
        self.state = state
        self.data = data
        self.precision = precision
        self.hooks = hooks or Hooks()
        # What the watchdog, the straggler check and the energy read of the loop, and
        # the one clock of its throughput (this job's first step left out).
        self.probe = probe or StepProbe(state.step, info.device)
        self.probe.watch_forward(state.model)
        self.loss_fn = nn.CrossEntropyLoss(label_smoothing=cfg.training.label_smoothing)
        self.forward_and_loss = forward_and_loss(state.model, self.loss_fn, cfg.hardware)

    def train_step(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        state = self.state
        probe = self.probe
        probe.forward_start()
        with autocast(self.precision, self.info.device):
            loss = self.forward_and_loss(images, labels)
        state.optimizer.zero_grad(set_to_none=True)
        probe.backward_start()
        state.scaler.scale(loss).backward()
        probe.optimizer_start()
        state.scaler.step(state.optimizer)
        state.scaler.update()
        state.schedule.step()
        state.step += 1
        probe.step_end(state.step, len(labels))
        return loss.detach()

    def train_epoch(self, epoch: int, start_batch: int = 0) -> EpochStats:
        state = self.state
        probe = self.probe
        state.model.train()
        loss_sum = torch.zeros((), device=self.info.device)
        steps = 0
        probe.open_window()
        probe.step_start()
        for batch, (images, labels) in enumerate(self.data.train.batches(epoch, start_batch),
                                                  start=start_batch + 1):
            if self.done_stepping():
                break
            probe.data_ready()
            loss = self.train_step(images, labels)
            loss_sum += loss
            steps += 1
            state.batch = batch
            self.after_step(StepDone(epoch, batch, state.step, len(labels), loss), loss_sum,
                            steps)
            probe.step_start()
        for hook in self.hooks.epoch_end:
            hook()
        return self.epoch_stats(loss_sum, steps, probe.close_window())

    def after_step(self, done: StepDone, loss_sum: torch.Tensor, steps: int) -> None:
        if steps % FINITE_CHECK_EVERY == 0:  # before the hooks: no save of a diverged run
            self.probe.enter(COLLECTIVE)
            self.check_loss(distributed.all_reduce_sum(loss_sum).item())
        self.probe.enter(CHECKPOINT)
        for hook in self.hooks.after_step:
            hook()
        for hook in self.hooks.progress:
            hook(done)

    def epoch_stats(self, loss_sum: torch.Tensor, steps: int, window: Window) -> EpochStats:
        """The epoch's mean loss (checked) and its images, summed over the ranks."""
        processes = self.info.world_size
        mean_loss = distributed.all_reduce_sum(loss_sum).item() / max(1, steps * processes)
        self.check_loss(mean_loss)
        counted = torch.tensor(float(window.images), device=self.info.device)
        all_images = int(distributed.all_reduce_sum(counted).item())
        return EpochStats(mean_loss, steps, window.epoch_s, all_images, window.seconds,
                          window.first_step_s)

    def check_loss(self, loss: float) -> None:
        """Stop a diverged run (every rank sees the same all-reduced value)."""
        if math.isfinite(loss) or self.cfg.training.allow_nonfinite_loss:
            return
        t = self.cfg.training
        raise NonFiniteLoss(f"the training loss became {loss} by step {self.state.step} "
                            f"(epoch {self.state.epoch + 1}): training diverged; lower "
                            f"--base-lr (now {t.base_lr}), warm up longer (--warmup-epochs, "
                            f"now {t.warmup_epochs}), or pass --allow-nonfinite-loss to train "
                            "on regardless")

    def evaluate(self) -> tuple[float, float]:
        """Accuracy and mean loss over the whole test set, summed across ranks."""
        self.probe.enter(EVALUATION)
        result = evaluate_model(self.state.model, self.data.test, self.precision,
                                self.info.device)
        return result.accuracy, result.loss

    def done_stepping(self) -> bool:
        limit = self.cfg.training.max_steps
        return bool(limit) and self.state.step >= limit

    def reached_target(self) -> bool:
        """The reference's rule: the last `patience` epochs all at or above the target."""
        t = self.cfg.training
        recent = self.state.accuracies[-t.patience:]
        return len(recent) == t.patience and min(recent) >= t.target_accuracy

    def stopped_partway(self) -> bool:
        """--max-steps ended the epoch before its last batch: the run stops at a position
        within it, not at an epoch end (a larger limit continues from there)."""
        return self.done_stepping() and self.state.batch < len(self.data.train)

    def fit(self) -> dict:
        """Train epoch by epoch until the epochs, the step limit or the early-stop rule
        ends it; the summary of the training part of the run. An epoch the step limit stops
        partway is evaluated and recorded, but stays unfinished: its checkpoint holds the
        position within it, and its accuracy is not one of the epochs' accuracies."""
        start_up_over()
        cfg = self.cfg.training
        state = self.state
        timed_images = 0
        timed_seconds = 0.0
        first_step_s = None
        stopped_early = False
        final = None  # the accuracy of the model as it is now, once evaluated
        while state.epoch < cfg.epochs and not self.done_stepping():
            stats = self.train_epoch(state.epoch, state.batch)
            partway = self.stopped_partway()
            self.probe.enter(CHECKPOINT)
            for hook in self.hooks.at_step_limit if partway else []:
                hook()  # before the evaluation: the position an uninterrupted run passes
            final, test_loss = self.evaluate()
            record = epoch_record(state.epoch, stats, final, test_loss,
                                  state.schedule.get_last_lr()[0])
            if not partway:
                state.accuracies.append(final)
                state.epoch = state.epoch + 1
                state.batch = 0
            timed_images += stats.timed_images
            timed_seconds += stats.timed_seconds
            first_step_s = first_step_s or stats.first_step_s
            self.probe.enter(CHECKPOINT)
            for hook in self.hooks.after_epoch:
                hook(record)
            if not partway and self.reached_target():
                logger.info(f"target accuracy {cfg.target_accuracy} reached for "
                            f"{cfg.patience} epochs: stopping after epoch {state.epoch}")
                stopped_early = True
                break
        final = self.final_accuracy() if final is None else final
        return dict(
            final_accuracy=final,
            best_accuracy=max([*state.accuracies, *([final] if final is not None else [])],
                              default=None),
            epochs_run=state.epoch + bool(state.batch), steps_run=state.step,
            stopped_early=stopped_early,
            images_per_second=timed_images / timed_seconds if timed_seconds else 0.0,
            first_step_s=first_step_s,
        )

    def final_accuracy(self) -> float | None:
        """A run that had nothing left to train: the last epoch's accuracy, or, stopped
        partway through an epoch, the model's as it is."""
        if self.state.batch:
            return self.evaluate()[0]
        return self.state.accuracies[-1] if self.state.accuracies else None
