"""What the GPU tier needs of the machine: CUDA, and for the two-rank NCCL test two GPUs
(NCCL refuses two ranks on one GPU, so there the test is left out, saying why)."""

from __future__ import annotations

CUDA_ABSENT = "CUDA is absent (torch.cuda.is_available() is False)"


def fewer_gpus_than(needed: int) -> str | None:
    """Why a test that needs `needed` GPUs cannot run here; None when it can."""
    import torch

    if not torch.cuda.is_available():
        return CUDA_ABSENT
    visible = torch.cuda.device_count()
    if visible < needed:
        return (f"left out: {visible} GPU visible, {needed} needed (NCCL refuses two ranks "
                "on one GPU)")
    return None
