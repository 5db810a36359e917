"""Settings that follow from others: the image side a run trains at and the model's stem.
Standard library only, so `train` knows both (and config.json records them) before torch
is imported."""

from __future__ import annotations

from workload.config.schema import TrainConfig
from workload.errors import UsageError

# The image side each dataset has when --image-size is 0.
NATURAL_IMAGE_SIZE = {"cifar100": 32, "digits": 32, "synthetic": 32, "imagefolder": 224}
# Images this large or larger get the ImageNet stem with --stem auto.
IMAGENET_STEM_FROM_PX = 64
# torchvision models whose stem can be swapped for the small-image one (conv1 + maxpool).
RESNET_FAMILY = ("resnet", "resnext", "wide_resnet")


def image_size_of(cfg: TrainConfig) -> int:
    return cfg.data.image_size or NATURAL_IMAGE_SIZE[cfg.data.dataset]


def stems_of(model: str) -> tuple[str, ...]:
    """The stems a model can have: the ResNet family both, the Wide ResNet only its small
    one, every other torchvision model only its own (designed for ImageNet)."""
    if model == "wrn":
        return ("small",)
    if model.startswith(RESNET_FAMILY):
        return ("imagenet", "small")
    return ("imagenet",)


def resolve_stem(cfg: TrainConfig) -> str:
    """`--stem auto` made concrete for this model and image size; a forced stem the model
    does not have is a UsageError."""
    name, wanted, size = cfg.model.name, cfg.model.stem, image_size_of(cfg)
    stems = stems_of(name)
    if wanted == "auto":
        if len(stems) == 1:
            return stems[0]
        return "imagenet" if size >= IMAGENET_STEM_FROM_PX else "small"
    if wanted not in stems:
        raise UsageError(f"--stem {wanted}: {name} has only the {stems[0]} stem (only the "
                         f"ResNet family, {', '.join(f'{p}*' for p in RESNET_FAMILY)}, has "
                         "both); leave out --stem")
    return wanted


def describe_stem(cfg: TrainConfig) -> str:
    """The start-up line's words for the stem."""
    stem, size, name = resolve_stem(cfg), image_size_of(cfg), cfg.model.name
    if len(stems_of(name)) == 1:
        return f"stem: {name}'s own ({stem}-image design) for {size} px images"
    how = ("7x7 stride-2 convolution and max-pool" if stem == "imagenet"
           else "3x3 stride-1 convolution, no max-pool")
    return (f"stem {stem} ({how}) for {size} px images; --stem auto takes imagenet from "
            f"{IMAGENET_STEM_FROM_PX} px")
