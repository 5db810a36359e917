"""The datasets: held in memory as uint8 tensors (the UCI digits, synthetic; CIFAR-100 in
cifar.py), or the user's own images read from files (image folders: their walk and
reading rules here, the torchvision dataset in imagefolder.py).

Each in-memory loader returns an `ArrayDataset` pair (train, test) of N x 3 x H x W uint8
images and int64 labels, so that a loader can place the whole set on the training device
once.

An image folder holds one folder per class under `train/` and `val/`. The rules
(docs/data-and-models.md#your-own-images): the folders are walked following
symbolic links, but a folder reached twice (a link loop, or two links to one folder) stops
the run with exit status 2 naming the link, before any training. A file that cannot be read
or decoded (unreadable, 0 bytes, not an image) is skipped with a warning naming it: the next
file of the dataset that reads takes its place in the batch (always the same one, so a
resumed run sees what the uninterrupted run saw). More than MAX_SKIPPED bad files in a row
stop the run.
"""

from __future__ import annotations

import contextlib
import gzip
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from workload.errors import UsageError
from workload.files import open_regular
from workload.logs import logger

# Per-channel mean and standard deviation used for normalisation (CIFAR-100's, as in the
# reference; also a reasonable choice for the other small-image sets).
CIFAR100_MEAN = (0.5071, 0.4867, 0.4408)
CIFAR100_STD = (0.2675, 0.2565, 0.2761)


@dataclass
class ArrayDataset:
    images: torch.Tensor  # uint8, N x 3 x H x W
    labels: torch.Tensor  # int64, N
    num_classes: int

    def __len__(self) -> int:
        return len(self.labels)


@dataclass
class SplitDataset:
    train: ArrayDataset
    test: ArrayDataset
    mean: tuple[float, float, float] = CIFAR100_MEAN
    std: tuple[float, float, float] = CIFAR100_STD


# The digits split is fixed whatever --seed says, so accuracies are comparable across runs.
DIGITS_SPLIT_SEED = 20240611
DIGITS_TEST_FRACTION = 0.2


# The 1,797 8x8 digits (the test set of UCI's "Optical Recognition of Handwritten Digits",
# the copy scikit-learn ships as sklearn/datasets/data/digits.csv.gz), in the package: one
# line per image, 64 pixels in 0..16 then the label. Provenance and licence: NOTICE.
DIGITS_FILE = Path(__file__).with_name("digits.csv.gz")


def read_digits(path: Path = DIGITS_FILE) -> tuple[np.ndarray, np.ndarray]:
    """The digits as (N x 8 x 8 float images in 0..16, N int64 labels), with numpy only."""
    with gzip.open(path, "rt") as f:
        table = np.loadtxt(f, delimiter=",", dtype=np.float64, ndmin=2)
    if table.shape[1] != 65:
        raise ValueError(f"{path}: {table.shape[1]} columns, expected 64 pixels and a label")
    return table[:, :64].reshape(-1, 8, 8), table[:, 64].astype(np.int64)


def load_digits(image_size: int = 32) -> SplitDataset:
    """The 1,797 handwritten 8x8 digits (UCI, as scikit-learn ships them), as 32x32 RGB uint8.

    The file ships inside this package, so it needs no network and no scikit-learn: the
    quick start and the convergence test use it.
    """
    digit_images, digit_labels = read_digits()
    pixels = torch.from_numpy(digit_images).float().unsqueeze(1) / 16.0  # N x 1 x 8 x 8
    scaled = F.interpolate(pixels, size=(image_size, image_size), mode="bilinear",
                           align_corners=False)
    images = (scaled.clamp(0, 1) * 255).round().to(torch.uint8).expand(-1, 3, -1, -1)
    labels = torch.from_numpy(digit_labels)
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(DIGITS_SPLIT_SEED))
    n_test = int(len(labels) * DIGITS_TEST_FRACTION)
    test_idx = order[:n_test]
    train_idx = order[n_test:]
    # Digits are dark strokes on white paper in spirit, but these are white on black:
    # use their own statistics rather than CIFAR's.
    mean = float(images.float().mean() / 255)
    std = float(images.float().std() / 255)
    return SplitDataset(
        ArrayDataset(images[train_idx].contiguous(), labels[train_idx], 10),
        ArrayDataset(images[test_idx].contiguous(), labels[test_idx], 10),
        mean=(mean,) * 3, std=(std,) * 3,
    )


SYNTHETIC_SEED = 1234


def load_synthetic(size: int, image_size: int, num_classes: int) -> SplitDataset:
    """Random images and labels of a chosen shape and count, for benchmarks and tests."""
    generator = torch.Generator().manual_seed(SYNTHETIC_SEED)

    def make(count: int) -> ArrayDataset:
        images = torch.randint(0, 256, (count, 3, image_size, image_size),
                               dtype=torch.uint8, generator=generator)
        labels = torch.randint(0, num_classes, (count,), generator=generator)
        return ArrayDataset(images, labels, num_classes)

    return SplitDataset(make(size), make(max(1, size // 5)))


MAX_SKIPPED = 16
_warned: set[str] = set()  # files already named in a warning by this process


def walk_once(top: str):
    """os.walk following links, refusing a folder it reaches a second time."""
    seen: dict[tuple[int, int], str] = {}
    for root, dirs, files in os.walk(top, followlinks=True):
        info = os.stat(root)
        first = seen.setdefault((info.st_dev, info.st_ino), root)
        if first != root:
            raise UsageError(f"{root} leads back to {first} (a symbolic link loop, or two "
                             "links to one folder): the image folder would be read forever "
                             "or twice; remove the link")
        yield root, dirs, files


# The most pixels an image file may decode to: a small PNG can hold 64 Mpixel (200 MB as
# RGB, more while decoding), which ends a process under a memory limit. PIL's own guard
# only warns below 89 Mpixel. The size is read from the file's header, before decoding.
MAX_PIXELS = 40_000_000
# What reading an image file raises when the file cannot be an image here.
UNREADABLE = (OSError, ValueError, SyntaxError, Image.DecompressionBombError, MemoryError)


def open_rgb(source) -> Image.Image:
    """An image decoded as RGB, whole (a truncated file is an OSError), refused
    (ValueError) past MAX_PIXELS before its pixels are decoded. `source`: a file object, or
    the path of a regular file (open_regular: a FIFO or a device is an OSError, never
    opened to wait). The one check of an image, for the readers and the shard writer."""
    file = (open(open_regular(source), "rb") if isinstance(source, (str, os.PathLike))
            else contextlib.nullcontext(source))
    with file as opened, Image.open(opened) as image:
        width, height = image.size
        if width * height > MAX_PIXELS:
            raise ValueError(f"{width} x {height} pixels is more than the "
                             f"{MAX_PIXELS // 10**6} Mpixel an image may have here; resize it")
        return image.convert("RGB")


def bad_file_note(path: str, error: Exception) -> None:
    if path not in _warned:
        _warned.add(path)
        text = getattr(error, "strerror", None) or str(error)  # no "[Errno 22]"
        why = text.strip().splitlines()[0] if text.strip() else type(error).__name__
        logger.warning(f"skipping {path}: it cannot be read as an image ({why}); the next "
                       "readable image takes its place")


# ImageNet's per-channel mean and standard deviation: an image folder's normalisation.
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
