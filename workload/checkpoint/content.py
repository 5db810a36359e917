"""What a loaded checkpoint must hold before any of it touches the live state.

A checkpoint whose files match its manifest can still hold the wrong things: a config that
is not a JSON object, a trainer state without its keys, a model file of another model. Each
is a CorruptCheckpoint here, raised before `restore` changes anything, so `--resume auto`
can move it aside and take the one before, and `--resume PATH` stops with one line.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from workload.checkpoint.store import MODEL_FILE, SHARDS_DIR, CorruptCheckpoint
from workload.distributed import unwrap

# The trainer state's keys and their types (what `restore` reads).
TRAINER_KEYS = dict(schedule=dict, scaler=dict, epoch=int, batch=int, step=int,
                    accuracies=list, world_size=int)
RNG_KEYS = ("torch", "numpy", "python")
# (FSDP's shards are checked as they are joined: workload.checkpoint.sharded.)


def read_config(path: Path) -> dict:
    """config.json of a checkpoint: a JSON object, or CorruptCheckpoint."""
    try:
        config = json.loads((path / "config.json").read_text())
    except (ValueError, UnicodeDecodeError):
        config = None
    if not isinstance(config, dict):
        raise CorruptCheckpoint(f"{path.name}/config.json is not a JSON object")
    return config


def _bad(path: Path, name: str, what: str) -> CorruptCheckpoint:
    return CorruptCheckpoint(f"{path.name}/{name} is not a checkpoint's {name}: {what}")


def check_loaded(path: Path, trainer, rng) -> None:
    """The trainer state and random states `restore` relies on, each failure naming the
    file."""
    if not isinstance(trainer, dict):
        raise _bad(path, "trainer.json", "not a dictionary")
    for key, kind in TRAINER_KEYS.items():
        if not isinstance(trainer.get(key), kind) or trainer.get(key) is True:
            raise _bad(path, "trainer.json", f"`{key}` is missing or not a {kind.__name__}")
    if not (isinstance(rng, list) and rng and all(
            isinstance(r, dict) and all(k in r for k in RNG_KEYS)
            and isinstance(r["torch"], torch.Tensor) and r["torch"].dtype == torch.uint8
            for r in rng)):
        raise _bad(path, "rng.json", f"not a list of random states ({', '.join(RNG_KEYS)})")


def check_state(path: Path, where: str, model, optimizer) -> None:
    """The model and optimizer state dicts read from `where` have their shapes."""
    if not (isinstance(model, dict) and model and all(isinstance(v, torch.Tensor)
                                                      for v in model.values())):
        raise _bad(path, where, "not a state dict of tensors")
    if not (isinstance(optimizer, dict) and isinstance(optimizer.get("state"), dict)
            and isinstance(optimizer.get("param_groups"), list)
            and all(isinstance(v, dict) for v in optimizer["state"].values())):
        raise _bad(path, "optimizer.json" if where.endswith("safetensors") else where,
                   "no `state` and `param_groups`")


def _examples(names) -> str:
    names = sorted(names)
    return ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")


def check_fits(snapshot, state, path: Path) -> None:
    """The checkpoint's model and optimizer fit the live ones (same parameter names and
    shapes, same parameter groups), or CorruptCheckpoint saying what differs."""
    live = unwrap(state.model).state_dict()  # FSDP2's DTensors have the global shapes
    missing, unexpected = live.keys() - snapshot.model.keys(), snapshot.model.keys() - live.keys()
    reshaped = {k for k in live.keys() & snapshot.model.keys()
                if tuple(live[k].shape) != tuple(snapshot.model[k].shape)}
    if missing or unexpected or reshaped:
        parts = [f"{len(names)} {what} ({_examples(names)})" for names, what in
                 ((missing, "missing"), (unexpected, "unexpected"), (reshaped, "of another shape"))
                 if names]
        where = SHARDS_DIR if snapshot.rank_buffers is not None else MODEL_FILE
        raise CorruptCheckpoint(f"{path.name}/{where} holds the weights of another model: "
                                f"{'; '.join(parts)}")
    groups = snapshot.optimizer["param_groups"]
    live_groups = state.optimizer.state_dict()["param_groups"]
    counts = [len(g["params"]) if isinstance(g, dict) and isinstance(g.get("params"), list)
              else -1 for g in groups]
    if counts != [len(g["params"]) for g in live_groups]:
        raise CorruptCheckpoint(f"{path.name}: its optimizer state belongs to another model "
                                f"(parameter groups of {counts} parameters, this model has "
                                f"{[len(g['params']) for g in live_groups]})")
    indices = snapshot.optimizer["state"].keys()
    if any(type(i) is not int or not 0 <= i < sum(counts) for i in indices):
        raise CorruptCheckpoint(f"{path.name}: the optimizer state names parameters this "
                                "model does not have")
