"""Preemption: a signal asks for one checkpoint and a requeue; the job script does the rest.

The handler only sets a flag (nothing else is safe inside a signal handler, least of all a
collective or a file write). At the next step boundary every rank contributes its flag to
one all-reduce, so a signal that reached a single rank stops all of them at the same step
and none is left waiting in a collective. The trainer then saves one checkpoint and exits
with REQUEUE_EXIT_STATUS; the batch script sees it and runs `scontrol requeue` on the host
(see jobs/lib/requeue.sh and docs/checkpoints.md).
"""

from __future__ import annotations

import torch

from workload import distributed
# The flag and the requeue request live in the launch layer (torch-free), where a user's
# own script can use them too; this module adds what needs torch.
from workload.launch.preemption import (REQUEUE_EXIT_STATUS, REQUEUE_FILE_ENV,  # noqa: F401
                                        PreemptionFlag, request_requeue)


class Preempted(Exception):
    """Raised at a step boundary after the preemption checkpoint was written."""

    def __init__(self, step: int, signal_name: str):
        super().__init__(f"preempted by {signal_name} at step {step}")
        self.step = step


def agree(flags: list[bool], device: torch.device) -> list[bool]:
    """Each flag is true if any rank set it: an all-reduce MAX, written as a sum over 0/1
    values (the same for booleans; distributed.py offers the sum)."""
    values = torch.tensor([float(f) for f in flags], device=device)
    return [v > 0 for v in distributed.all_reduce_sum(values).tolist()]
