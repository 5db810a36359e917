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
             torch.backends.cudnn.benchmark, torch.backends.cudnn.benchmark_limit)
    try:
        yield
    finally:
        (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
         torch.backends.cudnn.benchmark, torch.backends.cudnn.benchmark_limit) = saved


def configure_cudnn(device: torch.device, benchmark: bool, limit: int) -> None:
    """cuDNN benchmark mode on CUDA with --cudnn-benchmark (off by default, see the
    setting in config/schema.py): the input shape is fixed for a whole run, so timing the
    convolution algorithms once before the first step could pay back on every later one.
    `limit`: how many algorithms it tries per convolution (torch's default 10; 0 = every
    one)."""
    torch.backends.cudnn.benchmark = benchmark and device.type == "cuda"
    torch.backends.cudnn.benchmark_limit = limit


def autotune_convolutions(model: torch.nn.Module, images: tuple[int, ...], channels_last: bool,
                          precision: str, device: torch.device) -> bool:
    """Let cuDNN time its algorithms before the first step, so that the start-up shows it
    as a phase of its own: one step of `model` undone (one_step_undone) at the run's batch
    shape, memory format and autocast. cuDNN keys what it found by shape, type and layout,
    so the first step's convolutions find it. Whether it ran: only on CUDA in benchmark
    mode (elsewhere nothing is tuned)."""
    if device.type != "cuda" or not torch.backends.cudnn.benchmark:
        return False
    one_step_undone(model, images, channels_last, precision, device)
    torch.cuda.synchronize(device)
    return True


def one_step_undone(model: torch.nn.Module, images: tuple[int, ...], channels_last: bool,
                    precision: str, device: torch.device) -> None:
    """A forward and backward of `model` (eager, whatever is compiled in it) on random
    images in training mode, then the model as it was: its buffers (BatchNorm's
    statistics), no gradients, its mode, and the random states, so a run and its resume
    train the same with it or without it."""
    buffers = [(b, b.clone()) for b in model.buffers()]
    was_training = model.training
    model.train()
    with (torch.random.fork_rng(devices=[device] if device.type == "cuda" else []),
          torch.compiler.set_stance("force_eager")):
        batch = torch.randn(images, device=device)
        if channels_last:
            batch = batch.contiguous(memory_format=torch.channels_last)
        with autocast(precision, device):
            out = model(batch)
        out.float().sum().backward()
    with torch.no_grad():
        for buffer, saved in buffers:
            buffer.copy_(saved)
    for parameter in model.parameters():
        parameter.grad = None
    model.train(was_training)


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
