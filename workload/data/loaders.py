"""Loaders that feed the training loop: `device` for in-memory datasets, `torch` for folders,
and the one rule, shared by every data backend, of which samples each rank reads in which
order.

Every loader offers the same small interface: `len(loader)` batches per epoch on this rank,
and `loader.batches(epoch, start=0)` yielding (images, labels) already on the training
device, images normalised float tensors. `start` skips batches exactly, for resuming.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from workload.data.augment import Normalizer, augment, batch_work_threads
from workload.data.datasets import ArrayDataset
from workload.errors import UsageError
from workload.launch.preemption import leave_signals_to_parent, loop_signals_held

Batch = tuple[torch.Tensor, torch.Tensor]

# Mixing constants so that (seed, epoch, rank, batch) pairs never share a generator seed.
_EPOCH_STRIDE = 1_000_003
_RANK_STRIDE = 10_007
_BATCH_STRIDE = 101
_POSITION_STRIDE = 1_000_000_007  # more samples than any epoch holds
# torch generators take seeds below 2**64: the mixed values wrap around there (a seed up to
# --seed's limit of 2**32 - 1 would overflow otherwise; smaller ones are unchanged).
_SEED_SPACE = 2**64
_SAMPLE_SEED_SPACE = 2**63  # sample_seed's (the shard reader's since it was written)


def global_order(num_samples: int, seed: int, epoch: int) -> torch.Tensor:
    """The epoch's order of all samples: shuffled with a generator seeded by (seed, epoch),
    the same on every rank."""
    generator = torch.Generator().manual_seed((seed * _EPOCH_STRIDE + epoch) % _SEED_SPACE)
    return torch.randperm(num_samples, generator=generator)


def epoch_order(num_samples: int, seed: int, epoch: int, rank: int,
                world_size: int) -> torch.Tensor:
    """This rank's sample indices for one epoch: the global order dealt round-robin
    (`deal`)."""
    return deal(global_order(num_samples, seed, epoch), rank, world_size)


def deal(order: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    """This rank's part of an epoch's global order: every world_size-th entry from its
    rank on, the same count on every rank (the remainder is left out this epoch) so that
    all ranks run the same number of steps, and step b's global batch is the same entries
    at any number of ranks."""
    return order[rank::world_size][:len(order) // world_size]


def rank_positions(total: int, rank: int, world_size: int, train: bool) -> range:
    """This rank's places in an epoch's global sequence of `total` samples: the rule of
    `deal` (training) and `eval_shard` (evaluation), as a range, since its length is asked
    at every step."""
    if not train:
        return range(rank, total, world_size)
    return range(rank, total // world_size * world_size, world_size)


def eval_shard(num_samples: int, rank: int, world_size: int) -> torch.Tensor:
    """This rank's share of the test set: every sample is evaluated exactly once overall."""
    return torch.arange(rank, num_samples, world_size)


def batch_slice(indices, batch: int, batch_size: int):
    """The indices of batch number `batch` (the last one may be short)."""
    return indices[batch * batch_size:(batch + 1) * batch_size]


def batch_seed(seed: int, epoch: int, rank: int, batch: int) -> int:
    """Seed of the augmentation randomness of one batch: a resumed run can start mid-epoch
    and still draw exactly what the uninterrupted run drew."""
    mixed = ((seed * _EPOCH_STRIDE + epoch) * _RANK_STRIDE + rank) * _BATCH_STRIDE + batch
    return mixed % _SEED_SPACE


def sample_seed(seed: int, epoch: int, position: int) -> int:
    """The augmentation seed of the sample at `position` of an epoch's global sequence, for
    the loaders that augment one sample at a time (in DataLoader workers: see
    augment.seeded): a resumed run draws what the uninterrupted run drew, whichever worker
    a sample lands in, and at any number of ranks."""
    return ((seed * _EPOCH_STRIDE + epoch) * _POSITION_STRIDE + position) % _SAMPLE_SEED_SPACE


def num_batches(num_samples: int, batch_size: int, train: bool) -> int:
    # Training drops the last partial batch (as the reference does); evaluation keeps it.
    return num_samples // batch_size if train else -(-num_samples // batch_size)


class ShardedBatches:
    """This rank's samples and batch count, by the shared rule, for loaders that hold
    `labels`, `batch_size`, `train`, `seed`, `rank` and `world_size`."""

    def _indices(self, epoch: int) -> torch.Tensor:
        if self.train:
            return epoch_order(len(self.labels), self.seed, epoch, self.rank, self.world_size)
        return eval_shard(len(self.labels), self.rank, self.world_size)

    def __len__(self) -> int:
        return num_batches(len(self._indices(0)), self.batch_size, self.train)


class DeviceLoader(ShardedBatches):
    """The whole uint8 dataset on the training device; batches cut, augmented and
    normalised there with batched tensor operations (no per-sample Python work)."""

    def __init__(self, data: ArrayDataset, batch_size: int, device: torch.device,
                 normalizer: Normalizer, *, train: bool, seed: int = 0,
                 rank: int = 0, world_size: int = 1):
        self.images = data.images.to(device)
        self.labels = data.labels.to(device)
        self.batch_size = batch_size
        self.device = device
        self.normalize = normalizer
        self.train = train
        self.seed = seed
        self.rank = rank
        self.world_size = world_size

    def batches(self, epoch: int, start: int = 0) -> Iterator[Batch]:
        indices = self._indices(epoch).to(self.device)
        generator = torch.Generator(device=self.device)
        for b in range(start, len(self)):
            with batch_work_threads(self.device):
                idx = batch_slice(indices, b, self.batch_size)
                images = self.images[idx]
                if self.train:
                    generator.manual_seed(batch_seed(self.seed, epoch, self.rank, b))
                    images = augment(images, generator)
                batch = self.normalize(images), self.labels[idx]
            yield batch


class ShardSampler(torch.utils.data.Sampler):
    """The shared sharding rule as a DataLoader sampler of (sample index, augmentation seed)
    pairs (`sample_seed`; 0 for evaluation); set `epoch` and `start` (in samples) before
    use."""

    def __init__(self, num_samples: int, seed: int, rank: int, world_size: int, train: bool):
        self.num_samples = num_samples
        self.seed = seed
        self.rank = rank
        self.world_size = world_size
        self.train = train
        self.epoch = 0
        self.start = 0

    def _positions(self) -> range:
        return rank_positions(self.num_samples, self.rank, self.world_size, self.train)

    def __iter__(self):
        positions = self._positions()[self.start:]
        if not self.train:
            return ((p, 0) for p in positions)
        order = global_order(self.num_samples, self.seed, self.epoch).tolist()
        return ((order[p], sample_seed(self.seed, self.epoch, p)) for p in positions)

    def count(self) -> int:
        """This rank's samples in an epoch."""
        return len(self._positions())

    def __len__(self) -> int:
        return self.count() - self.start


class TorchLoader:
    """A classic DataLoader over decoded images (the fallback for image folders)."""

    def __init__(self, dataset, batch_size: int, device: torch.device, normalizer: Normalizer,
                 *, train: bool, seed: int, rank: int, world_size: int, workers: int,
                 sampler=None):
        # `sampler`: another order with ShardSampler's interface (shards.StreamSampler)
        if sampler is None:
            sampler = ShardSampler(len(dataset), seed, rank, world_size, train)
        self.sampler = sampler
        self.batch_size = batch_size
        self.train = train
        self.device = device
        self.normalize = normalizer
        self.loader = torch.utils.data.DataLoader(
            dataset, batch_size=batch_size, sampler=self.sampler, num_workers=workers,
            drop_last=train, pin_memory=device.type == "cuda",
            persistent_workers=workers > 0,
            # The sampler's items carry their own augmentation seeds: the iterators draw
            # their workers' seeds from a generator of their own, not from the global one
            # that dropout draws from, which a resumed run must find as the uninterrupted
            # run left it.
            generator=torch.Generator(),
            # SLURM's preemption, time limit and scancel signal every process of the step:
            # the workers leave them to the training loop, which checkpoints and then ends
            # them (a worker that died of SIGTERM would fail the run in the middle of a step).
            worker_init_fn=leave_signals_to_parent,
        )

    def __len__(self) -> int:
        return num_batches(self.sampler.count(), self.batch_size, self.train)

    def batches(self, epoch: int, start: int = 0) -> Iterator[Batch]:
        self.sampler.epoch = epoch
        self.sampler.start = start * self.batch_size
        with loop_signals_held():  # the workers start here (the first epoch's, then kept)
            batches = iter(self.loader)
        with one_line_from_workers():
            for images, labels in batches:
                with batch_work_threads(self.device):
                    images = self.normalize(images.to(self.device, non_blocking=True))
                yield images, labels.to(self.device, non_blocking=True)


@contextlib.contextmanager
def one_line_from_workers():
    """A UsageError raised in a DataLoader worker (a shard refused, too many unreadable
    images) as its own line: the DataLoader re-raises it with the worker's traceback
    around the message, which the command would print whole."""
    try:
        yield
    except UsageError as error:
        text = str(error).strip()
        if not text.startswith("Caught UsageError in DataLoader worker"):
            raise
        raise UsageError(text.splitlines()[-1].partition("UsageError: ")[2]) from None
