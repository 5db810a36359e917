"""Run `train`, but rank DIE_RANK SIGKILLs itself once, right after step DIE_AT_STEP.

    torchrun --max-restarts=1 --nproc-per-node=2 tests/scripts/die_once.py --dataset ...

The marker file DIE_ONCE_MARKER makes it once: the restarted rank finds it and trains on.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

from workload.training import trainer
from workload.train import cli

MARKER = Path(os.environ["DIE_ONCE_MARKER"])
STEP = int(os.environ["DIE_AT_STEP"])
RANK = int(os.environ.get("DIE_RANK", "1"))
original_train_step = trainer.Trainer.train_step


def train_step_then_die_once(self, images, labels):
    loss = original_train_step(self, images, labels)
    if self.info.rank == RANK and self.state.step == STEP and not MARKER.exists():
        MARKER.write_text(f"rank {RANK} killed itself after step {STEP}\n")
        os.kill(os.getpid(), signal.SIGKILL)
    return loss


trainer.Trainer.train_step = train_step_then_die_once
cli()  # as the `train` program: it ends the process
