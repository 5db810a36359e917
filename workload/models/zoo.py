"""torchvision's classification models by name: the head sized to the dataset's classes,
the ResNet family with the ImageNet stem or the small-image one.

The name is checked against torchvision's own registry (not a list kept here), so the
models of whichever torchvision the image ships are the ones offered.
"""

from __future__ import annotations

import difflib

import torch.nn as nn
import torchvision

from workload.config.derived import stems_of
from workload.errors import UsageError


def torchvision_names() -> list[str]:
    return sorted(torchvision.models.list_models(module=torchvision.models))


def check_model_name(name: str) -> None:
    """A UsageError listing the close matches unless `name` is wrn or a torchvision
    classification model."""
    names = torchvision_names()
    if name == "wrn" or name in names:
        return
    close = difflib.get_close_matches(name, ["wrn", *names], n=5, cutoff=0.6)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    raise UsageError(f"--model {name!r} is neither wrn nor one of torchvision's "
                     f"{len(names)} classification models{hint} (list them: python -c "
                     "'import torchvision as t; print(t.models.list_models(module=t.models))')")


def _extra_args(name: str, image_size: int) -> dict:
    """Builder arguments some models need besides the number of classes."""
    if name in ("googlenet", "inception_v3"):
        # One output in training mode too (no auxiliary heads), and no init warning.
        return dict(aux_logits=False, init_weights=True)
    if name.startswith("vit_"):
        return dict(image_size=image_size)  # the position embedding's grid
    return {}


def small_image_stem(model: nn.Module) -> nn.Module:
    """The usual CIFAR stem: 3x3 stride-1 convolution, no max-pool. The ImageNet stem (7x7
    stride 2 and a max-pool) would shrink a 32x32 image to 8x8 before the first stage."""
    model.conv1 = nn.Conv2d(3, model.conv1.out_channels, kernel_size=3, stride=1, padding=1,
                            bias=False)
    model.maxpool = nn.Identity()
    return model


def torchvision_model(name: str, num_classes: int, stem: str, image_size: int) -> nn.Module:
    builder = torchvision.models.get_model_builder(name)
    model = builder(weights=None, num_classes=num_classes, **_extra_args(name, image_size))
    # Only the ResNet family has the small-image variant; the others keep their own stem.
    return small_image_stem(model) if stem == "small" and "small" in stems_of(name) else model
