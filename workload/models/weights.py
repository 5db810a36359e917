"""Weights as safetensors (no unpickler, readable anywhere): `--init-from FILE` into a
fresh model, strictly unless the head is re-initialised, and `model.safetensors` written at
the end of a run.

Turning torchvision's published weights into such a file, on a login node with internet:
    python -c "import torchvision as t; from safetensors.torch import save_file;
    save_file(t.models.resnet50(weights='DEFAULT').state_dict(), 'resnet50.safetensors')"
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn as nn

from workload.distributed import unwrap
from workload.errors import UsageError
from workload.files import honour_umask


def head_names(model: nn.Module) -> set[str]:
    """The tensors of the classifier head: the last Linear (or Conv2d) layer registered."""
    last = ""
    for name, module in model.named_modules():
        if isinstance(module, (nn.Linear, nn.Conv2d)):
            last = name
    return {f"{last}.{key}" for key, _ in
            model.get_submodule(last).named_parameters(recurse=False)}


def _read(path: str) -> dict[str, torch.Tensor]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        return load_file(str(Path(path).expanduser()))
    except (OSError, SafetensorError) as error:
        raise UsageError(f"--init-from {path} is not a readable safetensors file "
                         f"({error})") from None


def first_mismatch(own: dict, theirs: dict, skip: set[str], head: set[str]) -> str | None:
    for name, tensor in own.items():
        if name not in theirs:
            return f"tensor {name!r} of the model is missing from the file"
        if name in skip:
            continue
        if theirs[name].shape != tensor.shape:
            fix = (" (the head: pass --init-reinit-head to start it afresh)"
                   if name in head else "")
            return (f"tensor {name!r} is {list(theirs[name].shape)} in the file but "
                    f"{list(tensor.shape)} in the model{fix}")
        if _kind(theirs[name]) != _kind(tensor):  # load_state_dict would cast silently
            return (f"tensor {name!r} is {theirs[name].dtype} in the file but {tensor.dtype} "
                    "in the model (its values would be truncated: weights of another kind?)")
    extra = next((name for name in theirs if name not in own), None)
    return None if extra is None else (f"tensor {extra!r} of the file is not in the model "
                                       "(weights of another architecture?)")


def _kind(tensor: torch.Tensor) -> str:
    """What a copy between dtypes keeps: any float into any float (bf16 weights into an
    fp32 model) keeps the values; int8 or bool into a float does not."""
    if tensor.dtype == torch.bool:
        return "bool"
    return "float" if tensor.is_floating_point() else "complex" if tensor.is_complex() else "int"


def first_nonfinite(tensors: dict[str, torch.Tensor]) -> str | None:
    """The first tensor holding a NaN or an infinity (a run that diverged), if any."""
    return next((name for name, tensor in tensors.items()
                 if tensor.is_floating_point() and not torch.isfinite(tensor).all()), None)


def load_initial_weights(model: nn.Module, path: str, reinit_head: bool = False) -> str:
    """Copy the file's tensors into `model`; every tensor must match by name and shape,
    except (with `reinit_head`) a head of another size. What was done, in words."""
    theirs, own, head = _read(path), model.state_dict(), head_names(model)
    skip = {n for n in head if reinit_head and n in theirs and theirs[n].shape != own[n].shape}
    problem = first_mismatch(own, theirs, skip, head)
    nonfinite = first_nonfinite({k: v for k, v in theirs.items() if k not in skip})
    if not problem and nonfinite:  # it would end, steps later, in "lower --base-lr"
        problem = (f"tensor {nonfinite!r} holds NaN or infinite values (saved from a run "
                   "that diverged, or damaged)")
    if problem:
        raise UsageError(f"--init-from {path}: {problem}; refusing to start from it")
    model.load_state_dict({k: v for k, v in theirs.items() if k not in skip}, strict=not skip)
    fresh = f", head {', '.join(sorted(skip))} started afresh" if skip else ""
    return f"initialised from {path}: {len(theirs) - len(skip)} tensors{fresh}"


def save_weights(model: nn.Module, path: Path, write: bool) -> None:
    """The plain model's tensors as safetensors (every rank gathers FSDP shards; only the
    rank with `write` writes)."""
    tensors = {}
    for name, tensor in unwrap(model).state_dict().items():
        if hasattr(tensor, "full_tensor"):  # FSDP2 shard: every rank takes part
            tensor = tensor.full_tensor()
        tensors[name] = tensor.detach().cpu().clone().contiguous()
    if write:
        from safetensors.torch import save_file

        tmp = path.with_name(f".{path.name}.tmp")
        try:
            save_file(tensors, str(tmp), metadata={"format": "pt"})
        except BaseException:  # a full disk, or an interrupt: no partial file left behind
            tmp.unlink(missing_ok=True)
            raise
        honour_umask(tmp)
        tmp.replace(path)
