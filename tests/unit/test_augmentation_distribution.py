"""Every data backend draws the reference's augmentation: crop offsets uniform over 0..8,
flips with probability 1/2, zero padding, and the same normalisation.

The images encode their own coordinates (tests/helpers/augmentation.py), so the offsets
and the flip of every augmented image can be read back and the whole image re-created.
(tests/gpu checks the `device` backend on CUDA the same way.)
"""

import pytest
import torch

from tests.helpers.augmentation import (BATCH, COUNT, assert_reference_augmentation,
                                        collect, coordinate_images)
from workload.bench.input import ReferenceLoader
from workload.data.augment import Normalizer
from workload.data.dali import ArraySource, DaliLoader
from workload.data.datasets import CIFAR100_MEAN, CIFAR100_STD, ArrayDataset
from workload.data.loaders import DeviceLoader, TorchLoader
from workload.data.augment import ArrayImages

CPU = torch.device("cpu")


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


@pytest.fixture(scope="module")
def data() -> ArrayDataset:
    return coordinate_images()


@pytest.mark.parametrize("backend", ["device", "torch", "dali", "reference"])
def test_backend_draws_the_reference_augmentation(backend, data):
    images, labels = collect(build(backend, data))
    assert_reference_augmentation(images, labels, data, normalizer(),
                                  exact_normalisation=backend != "reference")


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
