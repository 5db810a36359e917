"""Numeric precision: TF32 switches, autocast and the fp16 gradient scaler."""

from __future__ import annotations

import contextlib

import torch


def resolve_precision(requested: str, device: torch.device) -> str:
    """`auto`: bf16 on GPUs that support it (Ampere and newer), fp32 elsewhere."""
    if requested != "auto":
        return requested
    if device.type == "cuda" and torch.cuda.is_bf16_supported():
        return "bf16"
    return "fp32"


def configure_tf32(precision: str) -> None:
    """Set PyTorch's TF32 switches explicitly, both ways.

    Their defaults changed between releases (matmuls off since 1.12, convolutions on), so a
    run that says fp32 must switch TF32 off, and one that says tf32 must switch it on.
    """
    enabled = precision == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = enabled
    torch.backends.cudnn.allow_tf32 = enabled


@contextlib.contextmanager
def switches_kept():
    """The TF32 and cuDNN switches (configure_tf32, configure_cudnn) put back as they were
    afterwards: a program that runs a command in its own process keeps its own."""
    saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
             torch.backends.cudnn.benchmark)
    try:
        yield
    finally:
        (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
         torch.backends.cudnn.benchmark) = saved


def configure_cudnn(device: torch.device) -> None:
    """cuDNN benchmark mode on CUDA: the input shape is fixed for a whole run, so timing the
    convolution algorithms once on the first step pays back on every later one."""
    torch.backends.cudnn.benchmark = device.type == "cuda"


AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def autocast(precision: str, device: torch.device):
    """The forward-pass context: autocast for bf16/fp16, nothing for fp32/tf32."""
    dtype = AUTOCAST_DTYPES.get(precision)
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def grad_scaler(precision: str, device: torch.device) -> torch.amp.GradScaler:
    """fp16 gradients underflow without loss scaling; bf16 has fp32's range and needs none."""
    return torch.amp.GradScaler(device.type, enabled=precision == "fp16")
