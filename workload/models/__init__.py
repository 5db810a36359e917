"""The networks: the reference Wide ResNet (`wrn`) and every torchvision classification
model by name, with the stem for the image size; weights in and out as safetensors.

    wrn.py      the Wide ResNet of the Olivia guide
    zoo.py      torchvision's models by name (close matches for a wrong one), the stems
    weights.py  --init-from FILE.safetensors, and model.safetensors at the end of a run
    trained.py  load_trained(RUN_DIR), model_input(RUN_DIR): a finished run's model
                (model.json + its weights) and the normalisation of its input
"""

from __future__ import annotations

import torch.nn as nn

from workload.config import TrainConfig
from workload.config.derived import image_size_of, resolve_stem
from workload.models.wrn import ResidualBlock, WideResNet, conv_bn_relu
from workload.models.zoo import check_model_name, small_image_stem, torchvision_model
from workload.models.trained import load_trained, model_input


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


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


__all__ = ["ResidualBlock", "WideResNet", "build_model", "check_model_name", "conv_bn_relu",
           "count_parameters", "load_trained", "model_for", "model_input", "small_image_stem"]
