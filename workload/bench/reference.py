"""The reference workload's input pipeline and step (Olivia guide), as the baseline.

Exactly what the guide's dataset_utils.py and train_utils.py do: one PIL image at a time
through RandomHorizontalFlip, RandomCrop(32, padding=4), ToTensor and Normalize in a
DataLoader with num_workers=0; then a plain fp32 step with the model in NCHW.
"""

from __future__ import annotations

from typing import Iterator

import torch
import torchvision.transforms as transforms
from PIL import Image

from workload.data import ArrayDataset


class ReferenceImages(torch.utils.data.Dataset):
    """uint8 arrays served as torchvision's CIFAR100 serves them: a PIL image per sample."""

    def __init__(self, data: ArrayDataset, mean, std):
        self.hwc = data.images.permute(0, 2, 3, 1).contiguous().numpy()
        self.labels = data.labels.tolist()
        self.transform = transforms.Compose([
            transforms.RandomHorizontalFlip(),
            transforms.RandomCrop(data.images.shape[-1], padding=4),
            transforms.ToTensor(),
            transforms.Normalize(mean, std),
        ])

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int):
        return self.transform(Image.fromarray(self.hwc[index])), self.labels[index]


class ReferenceLoader:
    """The guide's DataLoader, with the interface of the project's loaders."""

    def __init__(self, data: ArrayDataset, mean, std, batch_size: int, device: torch.device):
        self.device = device
        self.loader = torch.utils.data.DataLoader(
            ReferenceImages(data, mean, std), batch_size=batch_size, shuffle=True,
            drop_last=True, num_workers=0, pin_memory=device.type == "cuda")

    def __len__(self) -> int:
        return len(self.loader)

    def batches(self, epoch: int, start: int = 0) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for images, labels in self.loader:
            yield images.to(self.device), labels.to(self.device)


def reference_step(model, optimizer, loss_fn, images, labels) -> None:
    """train_utils.train's loop body: fp32, no autocast, no scaler."""
    loss = loss_fn(model(images), labels)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
