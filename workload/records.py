"""What a run leaves behind: config.json, metrics.jsonl, summary.json in the output directory."""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch
import torch.nn as nn

from workload.distributed import unwrap
from workload.errors import UsageError
from workload.files import unwritable_reason
from workload.version import DISTRIBUTION, dali_versions, distribution_version


def prepare_output_dir(path: str) -> Path:
    """Create the output directory and prove it is writable, or fail before any training."""
    out = Path(path).expanduser()
    problem = unwritable_reason(out, create=True)
    if problem:
        raise UsageError(f"--output-dir {path} is not a writable directory ({problem}); "
                         "pass a folder you can write to, e.g. --output-dir $SCRATCH/runs/x")
    return out


def model_sha256(model: nn.Module) -> str:
    """sha256 over every parameter and buffer, by name in state-dict order.

    Two runs that end with bit-identical weights have the same digest, whatever wrapper
    (DDP, torch.compile) the model ran under.
    """
    digest = hashlib.sha256()
    for name, tensor in unwrap(model).state_dict().items():
        if hasattr(tensor, "full_tensor"):  # FSDP2 shard: gather the whole tensor
            tensor = tensor.full_tensor()
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def versions() -> dict:
    """Versions of what the numbers depend on; DALI's read as `--version` reads it, without
    importing it."""
    import torchvision

    found = {
        "torch": torch.__version__,
        "torchvision": torchvision.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.cuda.is_available() else None,
        "dali": dali_versions()[0],
        "workload": distribution_version(DISTRIBUTION),
    }
    return {k: v for k, v in found.items() if v is not None}
