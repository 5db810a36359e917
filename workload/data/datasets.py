"""Datasets held in memory as uint8 tensors: CIFAR-100, the UCI digits, synthetic.

Each loader returns an `ArrayDataset` pair (train, test) of N x 3 x H x W uint8 images and
int64 labels, so that a loader can place the whole set on the training device once.
"""

from __future__ import annotations

import gzip
import pickle
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from workload.data import cifarfile
from workload.errors import UsageError

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


CIFAR100_FOLDER = "cifar-100-python"


def find_cifar100(data_dir: str) -> Path:
    """The cifar-100-python folder inside `data_dir` (or `data_dir` itself)."""
    root = Path(data_dir).expanduser()
    for candidate in (root / CIFAR100_FOLDER, root):
        if (candidate / "train").is_file() and (candidate / "test").is_file():
            return candidate
    raise UsageError(
        f"CIFAR-100 not found: looked for {root / CIFAR100_FOLDER}/train and /test. "
        f"Compute nodes usually have no internet: on a login node run "
        f"'train --dataset cifar100 --data-dir {root} --download --prepare-data' "
        f"(or python -c \"import torchvision; torchvision.datasets.CIFAR100('{root}', "
        f"download=True)\"), then point --data-dir at that folder")


def read_cifar100_split(path: Path) -> ArrayDataset:
    """Read one file of the 'CIFAR-100 python version' straight into uint8 tensors, with
    no code run and nothing allocated beyond what such a file holds (see cifarfile.py)."""
    try:
        entry = cifarfile.load(path)
        data = cifarfile.images_of(entry[b"data"])
        labels = cifarfile.labels_of(entry[b"fine_labels"])
        images = torch.from_numpy(data.reshape(-1, 3, 32, 32).copy())
    except (OSError, pickle.UnpicklingError, EOFError, KeyError, ValueError, TypeError,
            AttributeError, IndexError, OverflowError) as error:
        raise UsageError(
            f"{path} is not a readable CIFAR-100 python file ({type(error).__name__}: {error}); "
            f"delete the folder and fetch it again with --download") from None
    if (len(images) != len(labels) or labels.size == 0 or labels.max() >= 100
            or labels.min() < 0):
        span = f"{labels.min()}..{labels.max()}" if labels.size else "?"
        raise UsageError(f"{path} holds {len(images)} images and {len(labels)} labels in "
                         f"{span} (CIFAR-100 has labels 0..99): not CIFAR-100; "
                         "fetch it again with --download")
    return ArrayDataset(images, torch.from_numpy(labels), num_classes=100)


def download_cifar100(data_dir: str) -> None:
    import torchvision  # only needed for the download

    try:
        torchvision.datasets.CIFAR100(str(Path(data_dir).expanduser()), download=True)
    except Exception as error:  # network errors come in many types
        raise UsageError(f"downloading CIFAR-100 into {data_dir} failed ({error}); "
                         "run --download on a machine with internet access") from None


def load_cifar100(data_dir: str, download: bool = False) -> SplitDataset:
    if download:
        download_cifar100(data_dir)
    folder = find_cifar100(data_dir)
    return SplitDataset(read_cifar100_split(folder / "train"),
                        read_cifar100_split(folder / "test"))


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
    test_idx, train_idx = order[:n_test], order[n_test:]
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
