"""The `device` data backend on CUDA draws the reference's augmentation, as it does on the
CPU (tests/unit/test_augmentation_distribution.py): same offsets and flips, same padding,
same normalisation, read back from images that encode their own coordinates."""

from __future__ import annotations

import pytest

from tests.helpers.augmentation import (BATCH, assert_reference_augmentation, collect,
                                        coordinate_images)

pytestmark = pytest.mark.gpu


def test_device_backend_on_cuda_draws_the_reference_augmentation(cuda):
    import torch

    from workload.data.augment import Normalizer
    from workload.data.datasets import CIFAR100_MEAN, CIFAR100_STD
    from workload.data.loaders import DeviceLoader

    data = coordinate_images()
    loader = DeviceLoader(data, BATCH, cuda, Normalizer(CIFAR100_MEAN, CIFAR100_STD, cuda),
                          train=True, seed=5, rank=0, world_size=1)
    first_images, _ = next(iter(loader.batches(epoch=0)))
    assert first_images.device == cuda  # prepared on the GPU, not copied there
    images, labels = collect(loader)
    on_cpu = Normalizer(CIFAR100_MEAN, CIFAR100_STD, torch.device("cpu"))
    assert_reference_augmentation(images, labels, data, on_cpu, exact_normalisation=False)
