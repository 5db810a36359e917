"""The user's own images: one folder per class under `train/` and `val/`."""

from __future__ import annotations

from pathlib import Path

import torchvision.transforms.v2 as T
from torchvision.datasets import ImageFolder

from workload.errors import UsageError

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def _transforms(image_size: int, train: bool) -> T.Compose:
    # uint8 tensors leave the workers; normalisation runs batched on the training device.
    if train:
        steps = [T.RandomResizedCrop(image_size, antialias=True), T.RandomHorizontalFlip()]
    else:
        steps = [T.Resize(image_size * 8 // 7, antialias=True), T.CenterCrop(image_size)]
    return T.Compose([T.PILToTensor(), *steps])


def _open_split(root: Path, split: str, image_size: int, train: bool) -> ImageFolder:
    folder = root / split
    if not folder.is_dir():
        raise UsageError(f"--data-dir {root} has no {split}/ folder; an image folder dataset "
                         f"needs {root}/train/<class>/*.jpg and {root}/val/<class>/*.jpg")
    try:
        return ImageFolder(str(folder), transform=_transforms(image_size, train))
    except (FileNotFoundError, PermissionError) as error:
        raise UsageError(f"cannot read images under {folder}: {error}; one sub-folder per "
                         "class with image files in each is expected") from None


def load_imagefolder(data_dir: str, image_size: int) -> tuple[ImageFolder, ImageFolder]:
    root = Path(data_dir).expanduser()
    train = _open_split(root, "train", image_size, train=True)
    val = _open_split(root, "val", image_size, train=False)
    if train.classes != val.classes:
        raise UsageError(f"{root}/train and {root}/val have different class folders "
                         f"({len(train.classes)} vs {len(val.classes)}); use the same names")
    return train, val
