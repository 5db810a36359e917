"""Preemption: a signal asks for one checkpoint and a requeue; the job script does the rest.

The handler only sets a flag (nothing else is safe inside a signal handler, least of all a
collective or a file write). At the next step boundary every rank contributes its flag to
one all-reduce, so a signal that reached a single rank stops all of them at the same step
and none is left waiting in a collective. The trainer then saves one checkpoint and exits
with REQUEUE_EXIT_STATUS; the batch script sees it and runs `scontrol requeue` on the host
(see jobs/lib/requeue.sh and docs/checkpoints.md).
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import torch

from workload import distributed

# "Requeue me": 75 is EX_TEMPFAIL in sysexits.h ("temporary failure, the user is invited to
# retry"). Python uses 1 (uncaught exception) and 2 (usage), shells 126, 127 and 128+N for
# a death by signal N, torchrun and srun pass a task's status through, and SLURM reports
# statuses as they are: none of them gives 75 another meaning.
REQUEUE_EXIT_STATUS = 75

# Set by jobs/lib/requeue.sh: a file every preempted rank writes after the checkpoint. The
# batch shell cannot always see status 75: `srun --kill-on-bad-exit=1` kills the ranks that
# exit a moment later than the first, and torchrun reports any failed worker as 1.
REQUEUE_FILE_ENV = "TRAIN_REQUEUE_FILE"


class Preempted(Exception):
    """Raised at a step boundary after the preemption checkpoint was written."""

    def __init__(self, step: int, signal_name: str):
        super().__init__(f"preempted by {signal_name} at step {step}")
        self.step = step


class PreemptionFlag:
    """Set by the signal handlers; read by the trainer at step boundaries."""

    def __init__(self):
        self.signal_name: str | None = None
        self._previous: dict[int, object] = {}

    def install(self, names: tuple[str, ...]) -> "PreemptionFlag":
        for name in dict.fromkeys(names):  # dict: unique, in order
            number = getattr(signal, "SIG" + name)
            self._previous[number] = signal.signal(number, self._handle)
        return self

    def uninstall(self) -> None:
        for number, handler in self._previous.items():
            signal.signal(number, handler)
        self._previous.clear()

    def _handle(self, number: int, frame) -> None:
        if number == signal.SIGINT and self.signal_name == "SIGINT":
            raise KeyboardInterrupt  # Ctrl-C twice: stop now, without the checkpoint
        self.signal_name = signal.Signals(number).name

    def is_set(self) -> bool:
        return self.signal_name is not None


def agree(flags: list[bool], device: torch.device) -> list[bool]:
    """Each flag is true if any rank set it: an all-reduce MAX, written as a sum over 0/1
    values (the same for booleans; distributed.py offers the sum)."""
    values = torch.tensor([float(f) for f in flags], device=device)
    return [v > 0 for v in distributed.all_reduce_sum(values).tolist()]


def request_requeue(step: int, signal_name: str) -> None:
    """Tell the batch shell (jobs/lib/requeue.sh) that this job wants a requeue."""
    path = os.environ.get(REQUEUE_FILE_ENV)
    if not path:
        return
    target = Path(path)
    tmp = target.with_name(f".{target.name}.{os.getpid()}")
    tmp.write_text(f"preempted by {signal_name} at step {step}\n")
    os.replace(tmp, target)  # atomic: several ranks may write it
