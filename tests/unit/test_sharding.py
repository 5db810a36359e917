"""Which samples each rank reads: the one rule every data backend shares."""

from __future__ import annotations

import torch

from workload.data.loaders import batch_seed, batch_slice, epoch_order, eval_shard


def test_ranks_read_disjoint_equal_shares_of_one_epoch():
    shares = [epoch_order(103, seed=1, epoch=0, rank=r, world_size=4) for r in range(4)]
    assert {len(s) for s in shares} == {103 // 4}  # same step count on every rank
    seen = torch.cat(shares)
    assert len(set(seen.tolist())) == len(seen)


def test_the_order_depends_on_seed_and_epoch_only():
    a = epoch_order(50, seed=3, epoch=2, rank=1, world_size=2)
    assert torch.equal(a, epoch_order(50, seed=3, epoch=2, rank=1, world_size=2))
    assert not torch.equal(a, epoch_order(50, seed=3, epoch=3, rank=1, world_size=2))
    assert not torch.equal(a, epoch_order(50, seed=4, epoch=2, rank=1, world_size=2))


def test_evaluation_covers_every_sample_once():
    shares = [eval_shard(10, r, 3) for r in range(3)]
    assert sorted(torch.cat(shares).tolist()) == list(range(10))


def test_batch_slice_cuts_consecutive_batches():
    indices = torch.arange(10)
    assert batch_slice(indices, 0, 4).tolist() == [0, 1, 2, 3]
    assert batch_slice(indices, 2, 4).tolist() == [8, 9]


def test_batch_seeds_differ_across_seed_epoch_rank_and_batch():
    seeds = {batch_seed(s, e, r, b) for s in range(3) for e in range(3) for r in range(4)
             for b in range(50)}
    assert len(seeds) == 3 * 3 * 4 * 50


def test_the_largest_seed_still_seeds_every_generator():
    seed = 2**32 - 1  # the largest --seed accepts
    torch.Generator().manual_seed(batch_seed(seed, 99, 7, 10_000))
    assert len(epoch_order(10, seed, 99, 0, 1)) == 10
