"""Run `train`, but rank FREEZE_RANK stops itself (SIGSTOP) right after step
FREEZE_AT_STEP, as a rank stuck where Python cannot run; it writes its pid to
FREEZE_MARKER first.

    torchrun --nproc-per-node=3 tests/scripts/freeze_once.py --dataset ...
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

from workload.training import trainer
from workload.train import cli

MARKER = Path(os.environ["FREEZE_MARKER"])
STEP = int(os.environ["FREEZE_AT_STEP"])
RANK = int(os.environ["FREEZE_RANK"])
original_train_step = trainer.Trainer.train_step


def train_step_then_freeze(self, images, labels):
    loss = original_train_step(self, images, labels)
    if self.info.rank == RANK and self.state.step == STEP:
        MARKER.write_text(str(os.getpid()))
        os.kill(os.getpid(), signal.SIGSTOP)
    return loss


trainer.Trainer.train_step = train_step_then_freeze
cli()  # as the `train` program: it ends the process
