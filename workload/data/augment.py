"""Batched augmentation on the training device: the reference's transforms, whole batches at once.

The reference applies RandomHorizontalFlip, RandomCrop(32, padding=4) (zero fill) and
Normalize to one PIL image at a time. Here the same distribution is drawn for a whole
uint8 batch with a few tensor operations on the device that trains: every image gets an
independent crop offset uniform in [0, 2*padding] per axis and a flip with probability 1/2.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def draw_flips_and_offsets(n: int, padding: int, generator: torch.Generator,
                           device: torch.device) -> tuple[torch.Tensor, ...]:
    """Per image: flip (bool, probability 1/2), then crop offsets dy, dx uniform in
    0..2*padding. One draw order for every backend that takes its randomness from here."""
    flip = torch.rand(n, device=device, generator=generator) < 0.5
    dy = torch.randint(0, 2 * padding + 1, (n,), device=device, generator=generator)
    dx = torch.randint(0, 2 * padding + 1, (n,), device=device, generator=generator)
    return flip, dy, dx


def crop_at(images: torch.Tensor, padding: int, dy: torch.Tensor, dx: torch.Tensor) -> torch.Tensor:
    """Zero-pad by `padding` and cut, from each image, the window of the original size at
    (dy[i], dx[i])."""
    n, c, h, w = images.shape
    padded = F.pad(images, (padding, padding, padding, padding))
    rows = (dy[:, None] + torch.arange(h, device=images.device))[:, None, :, None]
    cols = (dx[:, None] + torch.arange(w, device=images.device))[:, None, None, :]
    batch = torch.arange(n, device=images.device)[:, None, None, None]
    channel = torch.arange(c, device=images.device)[None, :, None, None]
    return padded[batch, channel, rows, cols]


def flip_where(images: torch.Tensor, flip: torch.Tensor) -> torch.Tensor:
    """Mirror left-right the images whose `flip` is true."""
    return torch.where(flip[:, None, None, None], images.flip(3), images)


class Normalizer:
    """uint8 images to normalised floats, optionally in channels-last memory format."""

    def __init__(self, mean, std, device: torch.device, channels_last: bool = False):
        self.scale = (1.0 / (255.0 * torch.tensor(std, device=device))).view(1, -1, 1, 1)
        self.shift = (torch.tensor(mean, device=device) / torch.tensor(std, device=device)).view(1, -1, 1, 1)
        self.memory_format = torch.channels_last if channels_last else torch.contiguous_format

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        out = images.float() * self.scale - self.shift
        return out.contiguous(memory_format=self.memory_format)


def augment(images: torch.Tensor, generator: torch.Generator, padding: int = 4) -> torch.Tensor:
    """The reference's training augmentation (flip, then padded crop) on a uint8 batch."""
    flip, dy, dx = draw_flips_and_offsets(len(images), padding, generator, images.device)
    return crop_at(flip_where(images, flip), padding, dy, dx)
