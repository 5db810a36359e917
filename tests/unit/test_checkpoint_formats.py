"""The checkpoint's two formats on their own: a tree of state into JSON and safetensors and
back, and FSDP shards joined into full tensors. No training here."""

from __future__ import annotations

import math

import pytest
import torch

from workload.checkpoint.formats import (CorruptCheckpoint, Shard, assemble, read_part,
                                         write_part)


def test_a_tree_of_state_comes_back_as_it_was(tmp_path):
    tree = {"state": {0: {"momentum_buffer": torch.arange(6.0).view(2, 3)},
                      1: {"step": torch.tensor(3)}},
            "param_groups": [{"lr": 0.1, "params": [0, 1], "foreach": None}],
            "numpy": ("MT19937", torch.arange(4, dtype=torch.int64), 7, 0.0),
            "odd": {"__tensor__": "not a reference"}, "inf": math.inf,
            "rng": torch.get_rng_state()}
    write_part(tmp_path, "part", tree)
    back = read_part(tmp_path, "part")
    assert back.keys() == tree.keys() and back["state"].keys() == {0, 1}
    assert torch.equal(back["state"][0]["momentum_buffer"], tree["state"][0]["momentum_buffer"])
    assert back["state"][1]["step"].dtype == torch.int64
    assert back["param_groups"] == tree["param_groups"]
    assert back["numpy"][0] == "MT19937" and isinstance(back["numpy"], tuple)
    assert back["odd"] == tree["odd"] and back["inf"] == math.inf
    assert torch.equal(back["rng"], tree["rng"]) and back["rng"].dtype == torch.uint8


def test_a_part_without_tensors_is_json_alone(tmp_path):
    write_part(tmp_path, "trainer", {"step": 4, "accuracies": [0.5]})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["trainer.json"]
    assert read_part(tmp_path, "trainer") == {"step": 4, "accuracies": [0.5]}


def test_a_reference_to_a_missing_tensor_is_corrupt(tmp_path):
    (tmp_path / "trainer.json").write_text('{"format": 2, "data": {"__tensor__": "gone"}}')
    with pytest.raises(CorruptCheckpoint, match="trainer.json"):
        read_part(tmp_path, "trainer")


def test_shards_of_every_rank_join_in_row_order():
    full = torch.arange(15.0).view(5, 3)
    # FSDP2 on 3 ranks: ceil(5 / 3) = 2 rows each, the last rank 1.
    trees = [{"w": Shard(full[0:2], 0, [5, 3]), "b": torch.ones(1)},
             {"w": Shard(full[2:4], 2, [5, 3]), "b": torch.zeros(1)},
             {"w": Shard(full[4:5], 4, [5, 3]), "b": torch.zeros(1)}]
    joined = assemble(trees[::-1][1:] + trees[-1:])  # any file order
    assert torch.equal(assemble(trees)["w"], full) and torch.equal(joined["w"], full)
    assert torch.equal(assemble(trees)["b"], torch.ones(1)), "rank 0's plain tensors"


@pytest.mark.parametrize("trees", [
    [{"w": Shard(torch.ones(2, 3), 0, [5, 3])}, {"w": Shard(torch.ones(2, 3), 3, [5, 3])}],
    [{"w": Shard(torch.ones(2, 3), 0, [5, 3])}, {"w": Shard(torch.ones(2, 3), 2, [5, 3])}],
    [{"w": Shard(torch.ones(2, 3), 0, [4, 3])}, {"v": Shard(torch.ones(2, 3), 2, [4, 3])}],
])
def test_shards_that_do_not_tile_are_refused(trees):
    with pytest.raises(ValueError):
        assemble(trees)


def test_a_restored_momentum_buffer_is_strided_like_its_channels_last_parameter(tmp_path):
    """The fused optimizers refuse a buffer strided otherwise than its parameter (on CUDA:
    `check_fast_path_restrictions`), and a checkpoint's tensors come back contiguous."""
    from workload.checkpoint.snapshot import load_optimizer

    conv = torch.nn.Conv2d(3, 8, 3).to(memory_format=torch.channels_last)
    saved = torch.optim.SGD(conv.parameters(), lr=0.1, momentum=0.9)
    for param in conv.parameters():
        param.grad = torch.rand_like(param)
    saved.step()
    write_part(tmp_path, "optimizer", saved.state_dict())
    restored = torch.optim.SGD(conv.parameters(), lr=0.1, momentum=0.9)
    load_optimizer(restored, read_part(tmp_path, "optimizer"))
    buffer = restored.state[conv.weight]["momentum_buffer"]
    assert buffer.stride() == conv.weight.stride() != buffer.contiguous().stride()
    assert torch.equal(buffer, saved.state[conv.weight]["momentum_buffer"])
