"""A trained model back from its run folder: the architecture model.json describes, the
weights of model.safetensors, every tensor matching by name and shape.

    from workload.models import load_trained, model_input
    model = load_trained("runs/digits")   # eval mode, on the CPU
    prepare = model_input("runs/digits")  # uint8 RGB N x 3 x H x W -> normalised floats
    probabilities = model(prepare(images)).softmax(1)
"""

from __future__ import annotations

import torch
import torch.nn as nn

from workload.config.trained import ModelDescription, ModelFiles, locate, read_description
from workload.errors import UsageError
from workload.models.weights import first_mismatch


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
        shift, scale = mean.to(images.device), std.to(images.device)
        return (images.float() / 255 - shift) / scale

    return prepare


def load_described(files: ModelFiles) -> tuple[ModelDescription, nn.Module]:
    """model.json checked, and the model it describes with the weights loaded (CPU)."""
    description = read_description(files.description)
    model = build_described(description, files)
    load_weights(model, files)
    return description, model


def build_described(description: ModelDescription, files: ModelFiles) -> nn.Module:
    from workload.models import build_model

    try:  # the arguments were checked with model.json (config/trained.py)
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
