"""On a GPU the straggler check times a rank's own work with CUDA events: the host runs
ahead of the GPU, so its clock would not see a slow GPU (docs/hangs.md#a-slow-rank)."""

from __future__ import annotations

import time

import pytest
import torch

from workload.training.probe import StepProbe

pytestmark = pytest.mark.gpu


def test_own_work_on_a_gpu_is_the_gpus_time_not_the_hosts(cuda):
    activity = StepProbe()
    activity.time_on_gpu()
    x = torch.randn(4096, 4096, device=cuda)
    x @ x  # cuBLAS starts outside the timed part
    torch.cuda.synchronize()
    host = time.perf_counter()
    start = activity.mark()
    for _ in range(50):  # queued: the host returns long before the GPU is done
        x = (x @ x).clamp_(-1, 1)
    activity.add_busy(start, activity.mark())
    queued_s = time.perf_counter() - host
    busy = activity.busy_total_s()  # waits for the GPU
    whole_s = time.perf_counter() - host
    assert activity.gpu_spans == []
    assert busy > 2 * queued_s and busy <= whole_s * 1.05, (busy, queued_s, whole_s)
