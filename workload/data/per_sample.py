"""Per-sample augmentation of in-memory uint8 images, for the classic DataLoader backend.

`ArrayImages` is what `--data-backend torch` reads for CIFAR, digits and synthetic data:
one uint8 C x H x W tensor at a time through torchvision's RandomHorizontalFlip and
RandomCrop(size, padding=4) in DataLoader workers; normalisation then runs batched on the
training device with the same `Normalizer` every backend uses.
"""

from __future__ import annotations

import torch
import torchvision.transforms.v2 as T

from workload.data.datasets import ArrayDataset

PADDING = 4


def train_transform(image_size: int) -> T.Compose:
    return T.Compose([T.RandomHorizontalFlip(), T.RandomCrop(image_size, padding=PADDING)])


class ArrayImages(torch.utils.data.Dataset):
    """(uint8 image, label) pairs from an ArrayDataset, augmented one sample at a time."""

    def __init__(self, data: ArrayDataset, train: bool):
        self.images, self.labels = data.images, data.labels
        self.transform = train_transform(data.images.shape[-1]) if train else None

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        image = self.images[index]
        if self.transform is not None:
            image = self.transform(image)
        return image, int(self.labels[index])
