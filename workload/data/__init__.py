"""Datasets (read into uint8 tensors or image folders) and the loaders that feed training.

`build_data(cfg, rank, world_size, local_world_size, device)` is the one entry point: it
reads the dataset named by the config and returns the training and test loaders for this
rank, with the backend chosen and the reason for the choice.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from workload.data.augment import Normalizer
from workload.data.datasets import SplitDataset, load_cifar100, load_digits, load_synthetic
from workload.data.imagefolder import IMAGENET_MEAN, IMAGENET_STD, load_imagefolder
from workload.data.loaders import DeviceLoader, TorchLoader, default_workers

# The image side each dataset has when --image-size is 0.
NATURAL_IMAGE_SIZE = {"cifar100": 32, "digits": 32, "synthetic": 32, "imagefolder": 224}


@dataclass
class DataBundle:
    train: DeviceLoader | TorchLoader
    test: DeviceLoader | TorchLoader
    num_classes: int
    num_train_samples: int
    backend: str
    reason: str


def read_in_memory(cfg, image_size: int) -> SplitDataset:
    if cfg.dataset == "cifar100":
        return load_cifar100(cfg.data_dir, cfg.download)
    if cfg.dataset == "digits":
        return load_digits(image_size)
    return load_synthetic(cfg.synthetic_size, image_size, cfg.num_classes)


def build_data(cfg, device: torch.device, rank: int = 0, world_size: int = 1,
               local_world_size: int = 1) -> DataBundle:
    image_size = cfg.image_size or NATURAL_IMAGE_SIZE[cfg.dataset]
    shard = dict(seed=cfg.seed, rank=rank, world_size=world_size)
    if cfg.dataset == "imagefolder":
        train, test = load_imagefolder(cfg.data_dir, image_size)
        normalizer = Normalizer(IMAGENET_MEAN, IMAGENET_STD, device, cfg.channels_last)
        workers = cfg.workers if cfg.workers >= 0 else default_workers(local_world_size)
        return DataBundle(
            TorchLoader(train, cfg.batch_size, device, normalizer, train=True,
                        workers=workers, **shard),
            TorchLoader(test, cfg.batch_size, device, normalizer, train=False,
                        workers=workers, **shard),
            len(train.classes), len(train), "torch",
            f"image files are decoded by {workers} DataLoader workers")
    split = read_in_memory(cfg, image_size)
    normalizer = Normalizer(split.mean, split.std, device, cfg.channels_last)
    return DataBundle(
        DeviceLoader(split.train, cfg.batch_size, device, normalizer, train=True, **shard),
        DeviceLoader(split.test, cfg.batch_size, device, normalizer, train=False, **shard),
        split.train.num_classes, len(split.train), "device",
        f"the {cfg.dataset} dataset fits in memory: it is augmented in batches on {device.type}")
