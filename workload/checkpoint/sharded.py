"""FSDP2 checkpoints: every rank writes and reads its own shard through
torch.distributed.checkpoint (DCP), into `<checkpoint>/sharded/`.

DCP reads its `.metadata` file with a plain `pickle.load`, which would run code planted in
it. `SafeMetadataReader` reads it with an unpickler that only knows DCP's own metadata
classes, torch sizes and dtypes, so the weights_only promise holds for shards too (the
shard files themselves are read by DCP with torch.load(weights_only=True)).
"""

from __future__ import annotations

import pickle
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.metadata import StorageMeta
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

SHARDED_DIR = "sharded"
METADATA = ".metadata"

# What DCP's metadata may reference: its own dataclasses and enums, torch sizes, dtypes
# and layouts, and paths. Anything else is refused before it is constructed.
_ALLOWED = {
    "torch.distributed.checkpoint.metadata": None,  # None: any name in the module
    "torch.distributed.checkpoint.filesystem": {"_StorageInfo"},
    "torch.distributed.checkpoint.planner": {"LoadItemType", "WriteItemType"},
    "torch.serialization": {"_get_layout"},
    "torch": {"Size"},
    "pathlib": {"Path", "PosixPath", "PurePosixPath"},
    "collections": {"OrderedDict"},
}


class UnsafeMetadata(Exception):
    pass


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        allowed = _ALLOWED.get(module, set())
        is_dtype = module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)
        if not (is_dtype or (module in _ALLOWED and (allowed is None or name in allowed))):
            raise UnsafeMetadata(f"{METADATA} refers to {module}.{name}, which DCP metadata "
                                 "never holds; refusing to unpickle it")
        return super().find_class(module, name)


def read_metadata_safely(folder: Path):
    with open(Path(folder) / METADATA, "rb") as f:
        return _MetadataUnpickler(f).load()


class SafeMetadataReader(FileSystemReader):
    """DCP's file reader with the metadata read by the restricted unpickler."""

    def read_metadata(self, *args, **kwargs):
        metadata = read_metadata_safely(Path(self.path))
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


def is_sharded(model: nn.Module) -> bool:
    """FSDP2 turns parameters into DTensors (which have `full_tensor`)."""
    return any(hasattr(p, "full_tensor") for p in model.parameters())


def save_sharded(model: nn.Module, optimizer, folder: Path) -> None:
    """A collective: every rank writes its shard (fsynced by DCP's writer)."""
    model_state, optimizer_state = get_state_dict(model, optimizer)
    dcp.save({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=folder)


def load_sharded(model: nn.Module, optimizer, folder: Path) -> None:
    """A collective: every rank reads the shards it owns onto its own device."""
    model_state, optimizer_state = get_state_dict(model, optimizer)
    state = {"model": model_state, "optimizer": optimizer_state}
    dcp.load(state, storage_reader=SafeMetadataReader(folder))
    set_state_dict(model, optimizer, model_state_dict=state["model"],
                   optim_state_dict=state["optimizer"])
