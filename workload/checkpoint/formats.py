"""The two file formats of a checkpoint: safetensors for tensors, JSON for the rest.

A part of the training state (the optimizer, the trainer state, the random states) is a
tree of dicts, lists, tuples, numbers, strings and tensors. `encode` turns it into JSON
in which every tensor is a reference, `{"__tensor__": "<key>"}`, to a tensor of the
part's safetensors file; `decode` puts it back together. JSON cannot say everything Python
can, so a few values carry a tag: a tuple is `{"__tuple__": [...]}`, a dict whose keys are
not all strings (the optimizer's state is keyed by parameter index) is
`{"__items__": [[key, value], ...]}`, a non-finite float is `{"__float__": "nan"}`. An
FSDP2 shard (a DTensor split along dim 0) is `{"__shard__": key, "shape": [global shape],
"offset": first row, "length": rows}`; `assemble` joins the shards of every rank.

Reading either format runs no code: safetensors is an 8-byte header length, a JSON header
(names, dtypes, shapes, offsets) and raw bytes; JSON is parsed strictly (no NaN, no number
beyond a float's range, nothing nested deeper than a checkpoint ever is). A JSON file that
is a pickle or a zip archive (what torch.save writes) is refused by its first bytes, before
anything else reads it. A safetensors file is judged by the safetensors parser alone: its
first 8 bytes are a length, which may well start with the pickle's 0x80; only when the
parser refuses it does the message say that it looks like a pickle or a zip.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from workload.checkpoint.writer.durable import (SAFETENSORS_METADATA, CorruptCheckpoint,
                                                json_bytes, MAX_DEPTH, read_json, sniff,
                                                write_durably)

PART_FORMAT = 2
_PLAIN = (int, str, bool, type(None))  # JSON as they are (a float may be non-finite)
_TAGS = ("__tensor__", "__tuple__", "__items__", "__float__", "__shard__")


@dataclass
class Shard:
    """One rank's rows [offset, offset + length) of a tensor of `shape`, split on dim 0."""
    tensor: torch.Tensor
    offset: int
    shape: list[int]


def _is_dtensor(value) -> bool:
    return hasattr(value, "to_local") and hasattr(value, "placements")


def _shard_entry(value, key: str, tensors: dict) -> dict:
    """An FSDP2 parameter or optimizer state: this rank's rows of it (FSDP2 splits dim 0
    like torch.chunk: ceil(rows / ranks) each, the last ranks with fewer or none)."""
    from torch.distributed.tensor import Shard as Placement

    if tuple(value.placements) != (Placement(0),):
        raise ValueError(f"{key}: only tensors sharded on dim 0 are saved, not "
                         f"{value.placements}")
    mesh = value.device_mesh
    rows = value.shape[0]
    chunk = -(-rows // mesh.size())
    local = value.to_local()
    key = cpu_copy(tensors, key, local)
    return {"__shard__": key, "shape": list(value.shape),
            "offset": min(mesh.get_local_rank() * chunk, rows), "length": local.shape[0]}


def unique_key(tensors: dict, key: str) -> str:
    """`key`, or a variant of it that `tensors` does not hold yet."""
    while key in tensors:  # {"a.b": x} and {"a": {"b": y}} would both be "t.a.b"
        key += "~"
    return key


def cpu_copy(tensors: dict, key: str, tensor: torch.Tensor) -> str:
    """A copy of `tensor` on the CPU into `tensors`, under `key` or a unique variant."""
    key = unique_key(tensors, key)
    tensors[key] = tensor.detach().to("cpu", copy=True).contiguous()
    return key


def encode(value, tensors: dict, key: str = "t", put=cpu_copy):
    """`value` as JSON-ready data; its tensors go into `tensors` under unique keys (`put`
    copies each there: a CPU copy, or a slice of an asynchronous save's staging buffer)."""
    if _is_dtensor(value):
        return _shard_entry(value, key, tensors)
    if isinstance(value, torch.Tensor):
        return {"__tensor__": put(tensors, key, value)}
    if isinstance(value, float) and not math.isfinite(value):
        return {"__float__": str(value)}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):  # plain items as they are (fast: a loop's `extra`
        # may hold millions of numbers)
        items = [v if type(v) in _PLAIN else encode(v, tensors, f"{key}.{i}", put)
                 for i, v in enumerate(value)]
        return items if isinstance(value, list) else {"__tuple__": items}
    if isinstance(value, dict):
        plain = all(isinstance(k, str) for k in value) and not set(value) & set(_TAGS)
        if plain:
            return {k: encode(v, tensors, f"{key}.{k}", put) for k, v in value.items()}
        return {"__items__": [[encode(k, tensors, f"{key}.k{i}", put),
                               encode(v, tensors, f"{key}.{i}", put)]
                              for i, (k, v) in enumerate(value.items())]}
    raise TypeError(f"{key}: a {type(value).__name__} cannot go into a checkpoint")


def decode(data, tensors: dict):
    """The tree `encode` was given (shards as `Shard`); KeyError/TypeError/ValueError when
    the data does not fit the tensors."""
    if isinstance(data, list):
        return [v if type(v) in _PLAIN else decode(v, tensors) for v in data]
    if not isinstance(data, dict):
        return data
    if len(data) == 1 and next(iter(data)) in _TAGS:
        tag, inner = next(iter(data.items()))
        if tag == "__tensor__":
            return tensors[inner]
        if tag == "__tuple__":
            return tuple(decode(v, tensors) for v in inner)
        if tag == "__float__":
            return float(inner)
        if tag == "__items__":
            return {_hashable(decode(k, tensors)): decode(v, tensors) for k, v in inner}
    if "__shard__" in data:
        return _shard(data, tensors)
    return {k: decode(v, tensors) for k, v in data.items()}


def _is_count(value) -> bool:
    return type(value) is int and 0 <= value < 2**62


def _shard(data: dict, tensors: dict) -> Shard:
    """A shard entry whose offset, length and shape are whole numbers of rows."""
    shape = data.get("shape")
    if not (_is_count(data.get("offset")) and _is_count(data.get("length"))
            and isinstance(shape, list) and shape and all(_is_count(n) for n in shape)):
        raise ValueError(f"shard {str(data.get('__shard__'))[:80]!r} has an offset, length "
                         "or shape that is not a number of rows")
    shard = Shard(tensors[data["__shard__"]], data["offset"], shape)
    if shard.tensor.dim() == 0 or shard.tensor.shape[0] != data["length"]:
        raise ValueError(f"shard {data['__shard__']} has {list(shard.tensor.shape)} rows, "
                         f"its layout says {data['length']}")
    return shard


def _hashable(key):
    if isinstance(key, (list, dict, torch.Tensor)):
        raise TypeError(f"a dictionary key cannot be {type(key).__name__}")
    return key


def assemble(trees: list):
    """One tree from every rank's: shards joined in order of their rows (they must tile
    the whole tensor), everything else taken from the first rank's tree."""
    first = trees[0]
    if isinstance(first, Shard):
        if not all(isinstance(t, Shard) for t in trees):
            raise ValueError("a tensor is sharded in one rank's file and not in another's")
        parts = sorted(trees, key=lambda s: s.offset)
        row = 0
        for part in parts:
            if part.offset != row or list(part.shape) != list(first.shape):
                raise ValueError(f"shards of a {first.shape} tensor do not tile it")
            row += part.tensor.shape[0]
        full = torch.cat([p.tensor for p in parts])
        if row != first.shape[0] or list(full.shape) != list(first.shape):
            raise ValueError(f"shards of a {first.shape} tensor do not tile it")
        return full
    if isinstance(first, dict):
        if any(not isinstance(t, dict) or t.keys() != first.keys() for t in trees):
            raise ValueError("the ranks' files hold different names")
        return {k: assemble([t[k] for t in trees]) for k in first}
    if isinstance(first, (list, tuple)):
        if any(not isinstance(t, (list, tuple)) or len(t) != len(first) for t in trees):
            raise ValueError("the ranks' files hold lists of different lengths")
        joined = [assemble([t[i] for t in trees]) for i in range(len(first))]
        return joined if isinstance(first, list) else tuple(joined)
    return first


def part_files(name: str, value, put=cpu_copy) -> list[tuple[str, bytes | dict]]:
    """A part's files in writing order: `<name>.safetensors` (its tensors, each where `put`
    placed it; absent when the part holds none), then `<name>.json` (the tree, tensors as
    references), as bytes."""
    tensors: dict = {}
    data = json_bytes(dict(format=PART_FORMAT, data=encode(value, tensors, put=put)))
    return [*([(f"{name}.safetensors", tensors)] if tensors else []), (f"{name}.json", data)]


def too_deep_to_read(value, depth: int) -> bool:
    """Whether the reader would refuse a part that holds `value` at `depth` (the part's
    file is at 0) for its nesting (workload.checkpoint.writer.durable.read_json: nothing at
    MAX_DEPTH or deeper), nested as `encode` writes it: a dict with a tag among its keys
    as `{"__items__": [[key, value], ...]}`, a tuple as `{"__tuple__": [...]}`. Walked
    without recursion and without encoding, and through containers only (a loop's
    `extra` may hold millions of numbers)."""
    containers = (dict, list, tuple)
    pending = [(value, depth)] if isinstance(value, containers) else []
    while pending:
        item, at = pending.pop()
        if isinstance(item, dict):
            tagged = bool(set(item) & set(_TAGS)) or not all(isinstance(k, str) for k in item)
            below = at + (3 if tagged else 1)
            children = list(item.values())
        else:
            below = at + (1 if isinstance(item, list) else 2)
            children = item
        if children and below >= MAX_DEPTH:
            return True
        pending += [(child, below) for child in children if isinstance(child, containers)]
    return False


def as_bytes(files) -> Iterator[tuple[str, bytes]]:
    """Each (name, content) of `files` with its content as bytes: a dict of tensors made a
    safetensors file, one file at a time (a save holds the bytes of the file it writes,
    and of those still being hashed beside it: store.finish_checkpoint)."""
    for name, content in files:
        yield name, content if isinstance(content, bytes) else safetensors_bytes(content)


def write_part(folder: Path, name: str, value) -> dict:
    """`part_files` written; their manifest entries by file name."""
    return {file: write_durably(folder / file, data)
            for file, data in as_bytes(part_files(name, value))}


def read_part(folder: Path, name: str):
    """What `write_part` wrote, or CorruptCheckpoint naming the file."""
    data = read_json(folder / f"{name}.json")
    file = folder / f"{name}.safetensors"
    tensors = read_tensors(file) if file.is_file() else {}
    try:
        if not (isinstance(data, dict) and data.get("format") == PART_FORMAT):
            raise ValueError(f"not a part of format {PART_FORMAT}")
        return decode(data["data"], tensors)
    except (KeyError, TypeError, ValueError, AttributeError, RecursionError) as error:
        raise CorruptCheckpoint(f"{folder.name}/{name}.json is not a checkpoint part "
                                f"(with {file.name}): {error}") from None


def safetensors_bytes(tensors: dict) -> bytes:
    """A safetensors file's bytes, in memory (write_durably hashes them as it writes)."""
    from safetensors.torch import save

    return save(tensors, metadata=SAFETENSORS_METADATA)


def read_tensors(file: Path) -> dict[str, torch.Tensor]:
    """A safetensors file's tensors (on the CPU), or CorruptCheckpoint naming the file."""
    from safetensors import SafetensorError
    from safetensors.torch import load

    try:
        return load(file.read_bytes())
    except (SafetensorError, ValueError, OSError) as error:
        sniff(file, safetensors_too=True)  # torch.save's or pickle's, named as such
        raise CorruptCheckpoint(f"{file.parent.name}/{file.name} is not a readable "
                                f"safetensors file ({error})") from None
