"""Images that encode their own coordinates, and reading the augmentation back from them:
what the CPU distribution test (tests/unit) and the GPU tier (tests/gpu) both check.

Channel 0 = row + 1, channel 1 = column + 1, channel 2 = sample number; 0 only in the
padding, so the offsets and the flip of every augmented image can be read back from its
pixels and the whole image re-created.
"""

from __future__ import annotations

import torch

from workload.data.augment import flip_and_crop
from workload.data.datasets import CIFAR100_MEAN, CIFAR100_STD, ArrayDataset

SIDE, PADDING, COUNT, BATCH = 32, 4, 2304, 256


def coordinate_images() -> ArrayDataset:
    rows = torch.arange(1, SIDE + 1, dtype=torch.uint8)[:, None].expand(SIDE, SIDE)
    cols = rows.T
    images = torch.empty(COUNT, 3, SIDE, SIDE, dtype=torch.uint8)
    images[:, 0], images[:, 1] = rows, cols
    images[:, 2] = (torch.arange(COUNT) % 255 + 1).to(torch.uint8)[:, None, None]
    return ArrayDataset(images, torch.arange(COUNT), num_classes=COUNT)


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
    """One epoch of a loader's batches, on the CPU."""
    batches = list(loader.batches(epoch=0))
    return (torch.cat([b[0].cpu() for b in batches]), torch.cat([b[1].cpu() for b in batches]))


def assert_reference_augmentation(images: torch.Tensor, labels: torch.Tensor,
                                  data: ArrayDataset, normalize, exact_normalisation: bool):
    """One epoch of augmented coordinate images (on the CPU) drew what the reference draws."""
    from scipy.stats import chisquare

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
    # Normalize compute the same affine map in another order, and a GPU may fuse it
    # differently: equal to float rounding).
    reference = normalize(expected)
    if exact_normalisation:
        assert torch.equal(images, reference)
    else:
        assert torch.allclose(images, reference, atol=1e-5)

    # The distribution: flips with probability 1/2 (within 5 standard deviations of a
    # binomial), each offset 0..8 equally likely (chi-square, p > 1e-4), nothing outside.
    n = len(flip)
    assert abs(flip.float().mean().item() - 0.5) < 5 * (0.25 / n) ** 0.5
    for offsets in (dy, dx):
        counts = torch.bincount(offsets, minlength=2 * PADDING + 1)
        assert len(counts) == 2 * PADDING + 1 and counts.min() > 0
        assert chisquare(counts.numpy()).pvalue > 1e-4
