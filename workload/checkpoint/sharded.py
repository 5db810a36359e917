"""FSDP2 checkpoints as safetensors: every rank writes its own shard, and any number of
ranks reads them back.

Each rank writes `shards/rank-NNNNN.safetensors` (its rows of every parameter and of
every optimizer state, `DTensor.to_local()`, and its own buffers) and `rank-NNNNN.json`:
the structure of its model and optimizer state dicts, and for each sharded tensor its
global shape and the rows this rank holds (FSDP2 places parameters as `Shard(0)`: dim 0
split like torch.chunk, ceil(rows / ranks) rows each, the last ranks with fewer or none).
Reading joins the rows of every rank's file into full tensors on the CPU (the layouts must
tile each tensor exactly), so a checkpoint written by N ranks loads into M ranks, sharded
or not: `load_model` and `load_optimizer` give each rank its slice of the full tensors
with `distribute_tensor`, which places them exactly as FSDP2 does.
No DCP, no pickle: torch.distributed.checkpoint's `.metadata` is a pickle.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from workload.checkpoint.formats import (PART_FORMAT, CorruptCheckpoint, Shard, assemble,
                                         decode, encode, json_bytes, read_json,
                                         read_tensors, tensor_bytes, write_durably)
from workload.distributed import unwrap


def shard_name(rank: int) -> str:
    return f"rank-{rank:05d}"


def is_sharded(model: nn.Module) -> bool:
    """FSDP2 turns parameters into DTensors (which have `full_tensor`)."""
    return any(hasattr(p, "full_tensor") for p in model.parameters())


def save_shards(model: nn.Module, optimizer, folder: Path, world_size: int) -> dict:
    """Every rank writes its own shard file and layout (fsynced); their manifest entries
    by file name (rank 0 gathers them for the manifest)."""
    rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
    tensors: dict = {}
    state = encode({"model": unwrap(model).state_dict(), "optimizer": optimizer.state_dict()},
                   tensors)
    name = shard_name(rank)
    layout = dict(format=PART_FORMAT, rank=rank, world_size=world_size, state=state)
    return {f"{name}.safetensors": write_durably(folder / f"{name}.safetensors",
                                                 tensor_bytes(tensors)),
            f"{name}.json": write_durably(folder / f"{name}.json", json_bytes(layout))}


def _read_shard(folder: Path, rank: int, world_size: int, listed) -> dict:
    name = shard_name(rank)
    for suffix in (".json", ".safetensors"):
        if f"{folder.name}/{name}{suffix}" not in listed:
            raise CorruptCheckpoint(f"{folder.parent.name}/{folder.name}/{name}{suffix} "
                                    f"is missing: {world_size} ranks wrote this checkpoint")
    layout = read_json(folder / f"{name}.json")
    tensors = read_tensors(folder / f"{name}.safetensors")
    try:
        if (layout["rank"], layout["world_size"]) != (rank, world_size):
            raise ValueError(f"it says rank {layout['rank']} of {layout['world_size']}")
        return decode(layout["state"], tensors)
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        raise CorruptCheckpoint(f"{folder.parent.name}/{folder.name}/{name}.json is not "
                                f"the layout of its shard ({error})") from None


def read_shards(folder: Path, world_size, listed) -> tuple[dict, dict, list[dict]]:
    """The full model and optimizer state dicts joined from every rank's shard, and each
    rank's own buffers; `listed`: the file names in the manifest."""
    if not isinstance(world_size, int) or world_size < 1:
        raise CorruptCheckpoint(f"{folder.parent.name}: the world size {world_size!r} of "
                                "its trainer state is not a number of ranks")
    trees = [_read_shard(folder, rank, world_size, listed) for rank in range(world_size)]
    try:
        full = assemble(trees)
        buffers = [{k: v for k, v in t["model"].items() if not isinstance(v, Shard)}
                   for t in trees]
        return full["model"], full["optimizer"], buffers
    except (KeyError, TypeError, ValueError, AttributeError, RuntimeError) as error:
        raise CorruptCheckpoint(f"{folder.parent.name}/{folder.name}: the shards do not "
                                f"fit together ({error})") from None


def _to_live(full: torch.Tensor, live) -> torch.Tensor:
    """`full` as the live tensor is laid out: this rank's slice of an FSDP2 DTensor (a
    collective), else the tensor itself (load_state_dict copies it to the device)."""
    if hasattr(live, "placements") and hasattr(live, "device_mesh"):
        from torch.distributed.tensor import distribute_tensor

        return distribute_tensor(full.to(live.device), live.device_mesh, live.placements)
    return full


def load_model(model: nn.Module, full: dict, buffers: dict | None = None) -> None:
    """Full tensors into the live model, sharded or not; `buffers` (this rank's own
    BatchNorm statistics) take precedence over the full state's."""
    module, own = unwrap(model), buffers or {}
    live = module.state_dict()
    module.load_state_dict({name: _to_live(own.get(name, full[name]), tensor)
                            for name, tensor in live.items()})


def load_optimizer(optimizer, full: dict) -> None:
    """A full optimizer state dict into the live optimizer: each state tensor shaped like
    its parameter is laid out like it (sharded under FSDP2)."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    state = {}
    for index, values in full["state"].items():
        param = params[index]
        state[index] = {key: _to_live(value, param) if isinstance(value, torch.Tensor)
                        and value.dim() > 0 and tuple(value.shape) == tuple(param.shape)
                        else value for key, value in values.items()}
    optimizer.load_state_dict({"state": state, "param_groups": full["param_groups"]})
