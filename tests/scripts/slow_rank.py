"""Run `train`, but rank SLOW_RANK's own work takes SLOW_MS longer at every step: a sleep
inside its forward span (between the probe's forward and backward marks), where the
straggler check times a rank's own work.

    RANK=1 ... SLOW_RANK=1 SLOW_MS=10 python tests/scripts/slow_rank.py --dataset ...
"""

from __future__ import annotations

import os
import time

from workload.train import cli
from workload.training.probe import StepProbe

DELAY_S = float(os.environ["SLOW_MS"]) / 1000
original_backward_start = StepProbe.backward_start


def backward_start_late(self: StepProbe) -> None:
    time.sleep(DELAY_S)  # before the backward mark: the forward span, own work
    original_backward_start(self)


if os.environ.get("RANK") == os.environ["SLOW_RANK"]:
    StepProbe.backward_start = backward_start_late
cli()  # as the `train` program: it ends the process
