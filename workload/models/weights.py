"""Weights as safetensors (no unpickler, readable anywhere): `--init-from FILE` into a
fresh model, strictly unless the head is re-initialised; `model.safetensors` written at
the end of a run; and a finished run's model back from its folder: the architecture
model.json describes, the weights of model.safetensors, every tensor matching by name and
shape.

    from workload.models import load_trained, model_input
    model = load_trained("runs/digits")   # eval mode, on the CPU
    prepare = model_input("runs/digits")  # uint8 RGB N x 3 x H x W -> normalised floats
    probabilities = model(prepare(images)).softmax(1)

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
from workload.files import replace_file
from workload.models.description import (ModelDescription, ModelFiles, locate,
                                         read_description)
from workload.models.networks import build_model


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
    theirs = _read(path)
    own = model.state_dict()
    head = head_names(model)
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
        from safetensors.torch import save

        # replace_file: a private temporary beside it, removed when the write fails (a
        # full disk, an interrupt), then renamed over the file.
        replace_file(path, save(tensors, metadata={"format": "pt"}))


def load_trained(path: str, device: str | torch.device = "cpu") -> nn.Module:
    """The model of a finished run (its folder, model.json or model.safetensors), in eval
    mode on `device`; a UsageError when a file is missing or does not match."""
    files = locate(str(path))
    _, model = load_described(files)
    return model.to(device).eval()


def model_input(path: str):
    """The normalisation model.json names, as a function of uint8 RGB batches (N x 3 x H x W,
    already at the model's input size) on any device."""
    description = read_description(locate(str(path)).description)
    mean = torch.tensor(description.mean).view(1, 3, 1, 1)
    std = torch.tensor(description.std).view(1, 3, 1, 1)

    def prepare(images: torch.Tensor) -> torch.Tensor:
        shift = mean.to(images.device)
        scale = std.to(images.device)
        return (images.float() / 255 - shift) / scale

    return prepare


def load_described(files: ModelFiles) -> tuple[ModelDescription, nn.Module]:
    """model.json checked, and the model it describes with the weights loaded (CPU)."""
    description = read_description(files.description)
    model = build_described(description, files)
    load_weights(model, files)
    return description, model


def build_described(description: ModelDescription, files: ModelFiles) -> nn.Module:
    try:  # the arguments were checked with model.json (description.py)
        return build_model(description.model, description.num_classes,
                           **description.arguments)
    except UsageError as error:
        raise UsageError(f"{files.description}: {error}") from None
    except (TypeError, ValueError, RuntimeError) as error:
        raise UsageError(f"{files.description}: the model cannot be built from its "
                         f"arguments ({error})") from None


def load_weights(model: nn.Module, files: ModelFiles) -> None:
    """model.safetensors into `model`: every tensor by name and shape, or a UsageError."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        theirs = load_file(str(files.weights))
    except (OSError, SafetensorError) as error:
        raise UsageError(f"{files.weights} is not a readable safetensors file ({error}); "
                         "the weights are damaged: train the run again or restore them"
                         ) from None
    problem = first_mismatch(model.state_dict(), theirs, set(), set())
    if problem:
        raise UsageError(f"{files.weights} does not fit the architecture in "
                         f"{files.description.name}: {problem}")
    model.load_state_dict(theirs)
