"""Every data backend draws the reference's augmentation: crop offsets uniform over 0..8,
flips with probability 1/2, zero padding, and the same normalisation.

The images encode their own coordinates (channel 0 = row + 1, channel 1 = column + 1,
channel 2 = sample number; 0 only in the padding), so the offsets and the flip of every
augmented image can be read back from its pixels and the whole image re-created.
"""

import pytest
import torch
from scipy.stats import chisquare

from workload.bench.reference import ReferenceLoader
from workload.data.augment import Normalizer, flip_and_crop
from workload.data.dali import ArraySource, DaliLoader
from workload.data.datasets import CIFAR100_MEAN, CIFAR100_STD, ArrayDataset
from workload.data.loaders import DeviceLoader, TorchLoader
from workload.data.per_sample import ArrayImages

SIDE, PADDING, COUNT, BATCH = 32, 4, 2304, 256
CPU = torch.device("cpu")


def coordinate_images() -> ArrayDataset:
    rows = torch.arange(1, SIDE + 1, dtype=torch.uint8)[:, None].expand(SIDE, SIDE)
    cols = rows.T
    images = torch.empty(COUNT, 3, SIDE, SIDE, dtype=torch.uint8)
    images[:, 0], images[:, 1] = rows, cols
    images[:, 2] = (torch.arange(COUNT) % 255 + 1).to(torch.uint8)[:, None, None]
    return ArrayDataset(images, torch.arange(COUNT), num_classes=COUNT)


def normalizer() -> Normalizer:
    return Normalizer(CIFAR100_MEAN, CIFAR100_STD, CPU)


def build(name: str, data: ArrayDataset):
    shard = dict(train=True, seed=5, rank=0, world_size=1)
    if name == "device":
        return DeviceLoader(data, BATCH, CPU, normalizer(), **shard)
    if name == "torch":
        return TorchLoader(ArrayImages(data, train=True), BATCH, CPU, normalizer(), workers=1,
                           **shard)
    if name == "dali":
        return DaliLoader(ArraySource(data), BATCH, CPU, normalizer(), threads=1, **shard)
    return ReferenceLoader(data, CIFAR100_MEAN, CIFAR100_STD, BATCH, CPU)


def to_uint8(images: torch.Tensor) -> torch.Tensor:
    mean = torch.tensor(CIFAR100_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(CIFAR100_STD).view(1, 3, 1, 1)
    return ((images * std + mean) * 255).round().to(torch.uint8)


def read_back(image: torch.Tensor) -> tuple[int, int, int]:
    """(flip, dy, dx) of one augmented uint8 image, read at its centre, which a shift of at
    most 4 pixels never moves into the padding."""
    i = j = SIDE // 2
    row, col = int(image[0, i, j]) - 1, int(image[1, i, j]) - 1
    flip = int(image[1, i, j + 1]) - 1 < col  # columns run backwards in a mirror image
    dy = row - i + PADDING
    dx = (SIDE - 1 - col) - j + PADDING if flip else col - j + PADDING
    return int(flip), dy, dx


def collect(loader) -> tuple[torch.Tensor, torch.Tensor]:
    batches = list(loader.batches(epoch=0))
    return torch.cat([b[0] for b in batches]), torch.cat([b[1] for b in batches])


@pytest.fixture(scope="module")
def data() -> ArrayDataset:
    return coordinate_images()


@pytest.mark.parametrize("backend", ["device", "torch", "dali", "reference"])
def test_backend_draws_the_reference_augmentation(backend, data):
    images, labels = collect(build(backend, data))
    assert len(images) == COUNT // BATCH * BATCH
    raw = to_uint8(images)
    draws = torch.tensor([read_back(image) for image in raw])  # flip, dy, dx per image
    flip, dy, dx = draws.unbind(1)

    # Each image is its own sample, re-created exactly from the offsets read back: zero
    # padding, the right crop, the right mirror image.
    assert torch.equal(raw[:, 2].amax((1, 2)), (labels % 255 + 1).to(torch.uint8))
    expected = flip_and_crop(data.images[labels], PADDING, flip.bool(), dy, dx)
    assert torch.equal(raw, expected)

    # The normalisation: the shared Normalizer, bit for bit (the reference's ToTensor and
    # Normalize compute the same affine map in another order: equal to float rounding).
    reference = normalizer()(expected)
    if backend == "reference":
        assert torch.allclose(images, reference, atol=1e-5)
    else:
        assert torch.equal(images, reference)

    # The distribution: flips with probability 1/2 (within 5 standard deviations of a
    # binomial), each offset 0..8 equally likely (chi-square, p > 1e-4), nothing outside.
    n = len(flip)
    assert abs(flip.float().mean().item() - 0.5) < 5 * (0.25 / n) ** 0.5
    for offsets in (dy, dx):
        counts = torch.bincount(offsets, minlength=2 * PADDING + 1)
        assert len(counts) == 2 * PADDING + 1 and counts.min() > 0
        assert chisquare(counts.numpy()).pvalue > 1e-4


def test_dali_draws_the_device_backends_very_images_on_the_cpu(data):
    # Both take their flips and offsets from the shared per-batch seed: on the CPU they
    # are the same tensors, so a run switching backends stays reproducible.
    device_images, device_labels = collect(build("device", data))
    dali_images, dali_labels = collect(build("dali", data))
    assert torch.equal(device_labels, dali_labels)
    assert torch.equal(device_images, dali_images)


def test_test_split_is_not_augmented_by_any_backend(data):
    make = {"device": lambda: DeviceLoader(data, BATCH, CPU, normalizer(), train=False),
            "torch": lambda: TorchLoader(ArrayImages(data, train=False), BATCH, CPU,
                                         normalizer(), train=False, seed=0, rank=0,
                                         world_size=1, workers=0),
            "dali": lambda: DaliLoader(ArraySource(data), BATCH, CPU, normalizer(),
                                       train=False)}
    plain = normalizer()(data.images)
    for name, loader in make.items():
        images, labels = collect(loader())
        assert torch.equal(labels, torch.arange(COUNT)), name
        assert torch.equal(images, plain), name
