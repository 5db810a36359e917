"""The networks by their `--model` name: the reference Wide ResNet of the Olivia guide
(`wrn`) and every torchvision classification model, with the stem for the image size.

torchvision's models are checked against torchvision's own registry (not a list kept here),
so the models of whichever torchvision the image ships are the ones offered; the head is
sized to the dataset's classes, the ResNet family has the ImageNet stem or the small-image
one.
"""

from __future__ import annotations

import difflib

import torch.nn as nn

from workload.config import TrainConfig, image_size_of, resolve_stem, stems_of
from workload.errors import UsageError


def conv_bn_relu(in_channels: int, out_channels: int) -> nn.Sequential:
    """3x3 convolution, batch norm, ReLU: the building brick of the reference network."""
    return nn.Sequential(
        nn.Conv2d(in_channels, out_channels, kernel_size=3, padding=1, bias=False),
        nn.BatchNorm2d(out_channels),
        nn.ReLU(inplace=True),
    )


class ResidualBlock(nn.Module):
    """Two conv-bn-relu bricks with dropout between; a 1x1 projection when the width changes."""

    def __init__(self, in_channels: int, out_channels: int, dropout: float):
        super().__init__()
        self.body = nn.Sequential(
            conv_bn_relu(in_channels, out_channels),
            nn.Dropout(p=dropout),
            conv_bn_relu(out_channels, out_channels),
        )
        # The reference projects with a biased 1x1 convolution, only where widths differ.
        self.shortcut = (
            nn.Conv2d(in_channels, out_channels, kernel_size=1)
            if in_channels != out_channels
            else nn.Identity()
        )

    def forward(self, x):
        return self.body(x) + self.shortcut(x)


class WideResNet(nn.Module):
    """The Wide ResNet of the Olivia guide (about 17.2 M parameters for 100 classes).

    Stem of 16 channels, three stages of `blocks_per_stage` residual blocks at widths
    `width`, 2*`width`, 4*`width` (160/320/640 by default), 2x2 max-pooling after the first
    two stages, global average pooling and a linear head.
    """

    def __init__(self, num_classes: int, width: int = 160, blocks_per_stage: int = 2,
                 dropout: float = 0.01, stem_width: int = 16):
        super().__init__()
        widths = [width, 2 * width, 4 * width]
        layers: list[nn.Module] = [conv_bn_relu(3, stem_width)]
        in_channels = stem_width
        for stage, out_channels in enumerate(widths):
            for _ in range(blocks_per_stage):
                layers.append(ResidualBlock(in_channels, out_channels, dropout))
                in_channels = out_channels
            if stage < len(widths) - 1:
                layers.append(nn.MaxPool2d(2))
        # Adaptive pooling instead of the reference's AvgPool2d(7): identical on 32x32
        # inputs (8x8 maps give one window either way) and correct for any image size.
        layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten()]
        self.features = nn.Sequential(*layers)
        self.fc = nn.Linear(in_channels, num_classes)

    def forward(self, x):
        return self.fc(self.features(x))


def torchvision_names() -> list[str]:
    import torchvision

    return sorted(torchvision.models.list_models(module=torchvision.models))


def check_model_name(name: str) -> None:
    """A UsageError listing the close matches unless `name` is wrn or a torchvision
    classification model."""
    if name == "wrn":  # torchvision's import (seconds) only for its own models
        return
    names = torchvision_names()
    if name in names:
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
    import torchvision

    builder = torchvision.models.get_model_builder(name)
    model = builder(weights=None, num_classes=num_classes, **_extra_args(name, image_size))
    # Only the ResNet family has the small-image variant; the others keep their own stem.
    return small_image_stem(model) if stem == "small" and "small" in stems_of(name) else model


def build_model(name: str, num_classes: int, width: int = 160, blocks_per_stage: int = 2,
                dropout: float = 0.01, stem: str = "small", image_size: int = 32) -> nn.Module:
    """Build a model by its `--model` name (the width, depth and dropout are wrn's; the
    stem is the ResNet family's; the image size matters to ViTs only)."""
    if name == "wrn":
        return WideResNet(num_classes, width, blocks_per_stage, dropout)
    check_model_name(name)
    return torchvision_model(name, num_classes, stem, image_size)


def model_for(cfg: TrainConfig, num_classes: int) -> nn.Module:
    """The configured model, its stem resolved for the image size (`--stem auto`)."""
    m = cfg.model
    return build_model(m.name, num_classes, m.width, m.blocks_per_stage, m.dropout,
                       stem=resolve_stem(cfg), image_size=image_size_of(cfg))


def residual_blocks(model: nn.Module) -> list[nn.Module]:
    """The residual blocks of wrn and torchvision's ResNet family (--compile-scope blocks):
    a conv-BatchNorm-ReLU body and its skip connection, where the bytes that BatchNorm,
    ReLU and the add move between the convolutions are, and what one compiled region
    fuses."""
    from torchvision.models.resnet import BasicBlock, Bottleneck

    return [m for m in model.modules() if isinstance(m, (ResidualBlock, BasicBlock, Bottleneck))]


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
