"""Test-set evaluation, one home for `train` (after every epoch) and `evaluate`: the same
batches, precision and sums, so `evaluate` on a run's own data gives its final accuracy."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn

from workload import distributed
from workload.precision import autocast


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
