"""Which samples each rank reads, in which order: one rule shared by every data backend."""

from __future__ import annotations

import torch

# Mixing constants so that (seed, epoch, rank, batch) pairs never share a generator seed.
_EPOCH_STRIDE = 1_000_003
_RANK_STRIDE = 10_007
_BATCH_STRIDE = 101
# torch generators take seeds below 2**64: the mixed values wrap around there (a seed up to
# --seed's limit of 2**32 - 1 would overflow otherwise; smaller ones are unchanged).
_SEED_SPACE = 2**64


def epoch_order(num_samples: int, seed: int, epoch: int, rank: int, world_size: int,
                shuffle: bool = True) -> torch.Tensor:
    """This rank's sample indices for one epoch.

    Shuffled with a generator seeded by (seed, epoch), the same on every rank, then dealt
    round-robin; every rank gets the same count (the remainder is left out this epoch) so
    that all ranks run the same number of steps.
    """
    if shuffle:
        generator = torch.Generator().manual_seed((seed * _EPOCH_STRIDE + epoch) % _SEED_SPACE)
        order = torch.randperm(num_samples, generator=generator)
    else:
        order = torch.arange(num_samples)
    per_rank = num_samples // world_size
    return order[rank::world_size][:per_rank]


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
