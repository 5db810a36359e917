"""Augmentation and normalisation: batched on the training device, or one sample at a time.

The reference applies RandomHorizontalFlip, RandomCrop(32, padding=4) (zero fill) and
Normalize to one PIL image at a time. Here the same distribution is drawn for a whole
uint8 batch with a few tensor operations on the device that trains: every image gets an
independent crop offset uniform in [0, 2*padding] per axis and a flip with probability 1/2.

`ArrayImages` is what `--data-backend torch` reads for CIFAR, digits and synthetic data:
one uint8 C x H x W tensor at a time through torchvision's RandomHorizontalFlip and
RandomCrop(size, padding=4) in DataLoader workers, each sample's draws `seeded` by the
seed its sampler hands with it (as an image folder's and a shard folder's are);
normalisation then runs batched on the training device with the same `Normalizer` every
backend uses.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F

from workload.data.datasets import ArrayDataset

PADDING = 4  # pixels of zeros around an image before the random crop (the reference's)


def draw_flips_and_offsets(n: int, padding: int, generator: torch.Generator,
                           device: torch.device) -> tuple[torch.Tensor, ...]:
    """Per image: flip (bool, probability 1/2), then crop offsets dy, dx uniform in
    0..2*padding. One draw order for every backend that takes its randomness from here."""
    flip = torch.rand(n, device=device, generator=generator) < 0.5
    dy = torch.randint(0, 2 * padding + 1, (n,), device=device, generator=generator)
    dx = torch.randint(0, 2 * padding + 1, (n,), device=device, generator=generator)
    return flip, dy, dx


def flip_and_crop(images: torch.Tensor, padding: int, flip: torch.Tensor, dy: torch.Tensor,
                  dx: torch.Tensor) -> torch.Tensor:
    """Mirror the images whose `flip` is true, zero-pad by `padding` and cut from each the
    window of the original size at (dy, dx).

    One gather over a strided view of every possible window (of the padded batch and of its
    mirror image) instead of per-pixel index arithmetic: about four times faster on a CPU,
    and the same pixels.
    """
    n, c, h, w = images.shape
    padded = F.pad(images, (padding, padding, padding, padding))
    both = torch.stack([padded, padded.flip(3)], 1)                     # n, 2, c, H, W
    windows = both.unfold(3, h, 1).unfold(4, w, 1).permute(0, 1, 3, 4, 2, 5, 6)
    batch = torch.arange(n, device=images.device)                       # n, 2, dy, dx, c, h, w
    return windows[batch, flip.long(), dy, dx]


@contextlib.contextmanager
def batch_work_threads(device: torch.device):
    """One CPU thread for preparing a batch on the CPU, the previous count restored after.

    A batch is a few hundred microseconds of memory traffic: splitting each small operation
    over threads gains nothing, and on a busy node every parallel region waits for its
    slowest thread (measured on a shared 2-core machine: 70 ms a batch with 2 threads,
    11 ms with 1; see docs/performance.md). The model keeps every thread.
    """
    if device.type != "cpu":
        yield
        return
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


class Normalizer:
    """uint8 images to normalised floats, optionally in channels-last memory format."""

    def __init__(self, mean, std, device: torch.device, channels_last: bool = False):
        self.mean = tuple(float(m) for m in mean)
        self.std = tuple(float(s) for s in std)
        self.scale = (1.0 / (255.0 * torch.tensor(std, device=device))).view(1, -1, 1, 1)
        shift = torch.tensor(mean, device=device) / torch.tensor(std, device=device)
        self.shift = shift.view(1, -1, 1, 1)
        self.memory_format = torch.channels_last if channels_last else torch.contiguous_format

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        out = images.float().mul_(self.scale).sub_(self.shift)  # in place: one buffer
        return out.contiguous(memory_format=self.memory_format)


def augment(images: torch.Tensor, generator: torch.Generator,
            padding: int = PADDING) -> torch.Tensor:
    """The reference's training augmentation (flip, then padded crop) on a uint8 batch."""
    flip, dy, dx = draw_flips_and_offsets(len(images), padding, generator, images.device)
    return flip_and_crop(images, padding, flip, dy, dx)


def seeded(transform, image, seed: int):
    """`transform(image)` drawing from the CPU generator seeded by `seed` (loaders.sample_seed:
    a function of the sample's place in the epoch, not of the worker that reads it), the
    generator then put back as it was (without workers it is the training loop's, which
    dropout draws from). The generator alone: torch.manual_seed also seeds every other
    device kind, half a millisecond a sample, a tenth of decoding and augmenting."""
    generator = torch.default_generator
    state = generator.get_state()
    try:
        generator.manual_seed(seed)
        return transform(image)
    finally:
        generator.set_state(state)


def train_transform(image_size: int):
    """torchvision's flip and crop (imported here: its import takes seconds, which the
    batched backends do without)."""
    import torchvision.transforms.v2 as T

    return T.Compose([T.RandomHorizontalFlip(), T.RandomCrop(image_size, padding=PADDING)])


class ArrayImages(torch.utils.data.Dataset):
    """(uint8 image, label) pairs from an ArrayDataset, augmented one sample at a time;
    items are (index, augmentation seed), as loaders.ShardSampler yields them."""

    def __init__(self, data: ArrayDataset, train: bool):
        self.images = data.images
        self.labels = data.labels
        self.transform = train_transform(data.images.shape[-1]) if train else None

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, item: tuple[int, int]) -> tuple[torch.Tensor, int]:
        index, seed = item
        image = self.images[index]
        if self.transform is not None:
            image = seeded(self.transform, image, seed)
        return image, int(self.labels[index])
