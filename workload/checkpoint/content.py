"""What a loaded checkpoint must hold before any of it touches the live state.

A checkpoint whose files match its manifest can still hold the wrong things: a config that
is not a JSON object, a trainer state without its keys or with a step of -5, random states
numpy would crash on, an optimizer state of other shapes, a model file of another model.
Each is a CorruptCheckpoint here, raised before `restore` changes anything, so `--resume
auto` can move it aside and take the one before, and `--resume PATH` stops with one line.
Two stages: `check_loaded` (types, ranges, and how the trainer state, the random states
and the manifest agree) as the files are read, and `check_fits` (every tensor, number and
switch against the live model, optimizer, schedule and scaler) before the restore.
"""

from __future__ import annotations

import math
import random
import re
from pathlib import Path

import numpy as np
import torch

from workload.checkpoint.writer.durable import read_json
from workload.config import out_of_range
from workload.checkpoint.writer.store import MANIFEST, MODEL_FILE, SHARDS_DIR, CorruptCheckpoint
from workload.distributed import unwrap
from workload.logs import shown

# The trainer state's keys and their types (what `restore` reads).
TRAINER_KEYS = dict(schedule=dict, scaler=dict, epoch=int, batch=int, step=int,
                    accuracies=list, world_size=int)
# (FSDP's shards are checked as they are joined: workload.checkpoint.snapshot.)


def read_config(path: Path) -> dict:
    """config.json of a checkpoint: a JSON object, or CorruptCheckpoint."""
    config = read_json(path / "config.json")
    if not isinstance(config, dict):
        raise CorruptCheckpoint(f"{path.name}/config.json is not a JSON object")
    return config


def _bad(path: Path, name: str, what: str) -> CorruptCheckpoint:
    return CorruptCheckpoint(f"{path.name}/{name} is not a checkpoint's {name}: {what}")


def check_loaded(path: Path, trainer, rng, manifest: dict) -> None:
    """The trainer state and random states `restore` relies on, each failure naming the
    file."""
    if not isinstance(trainer, dict):
        raise _bad(path, "trainer.json", "not a dictionary")
    for key, kind in TRAINER_KEYS.items():
        if not isinstance(trainer.get(key), kind) or isinstance(trainer.get(key), bool):
            what = {dict: "a dictionary", int: "a whole number", list: "a list"}[kind]
            raise _bad(path, "trainer.json", f"`{key}` is missing or not {what}")
    _check_counts(path, trainer, manifest)
    if not all(type(a) in (int, float) and 0 <= a <= 1 for a in trainer["accuracies"]):
        raise _bad(path, "trainer.json", "`accuracies` are not all numbers from 0 to 1")
    if not isinstance(rng, list):
        raise _bad(path, "rng.json", "not a list of every rank's random states")
    if len(rng) != trainer["world_size"]:
        raise _bad(path, "trainer.json", f"`world_size` is {trainer['world_size']}, but "
                   f"rng.json holds the random states of {len(rng)} ranks")
    for rank, states in enumerate(rng):
        try:
            check_states(states)
        except ValueError as error:
            raise _bad(path, "rng.json", f"rank {rank}: {error}") from None


def _check_counts(path: Path, trainer: dict, manifest: dict) -> None:
    """Step, epoch, batch and world size in range, and as the manifest and the folder's
    name say: every epoch took a step at least, and so did every batch of one."""
    step = trainer["step"]
    for key in ("step", "epoch", "batch", "world_size"):
        value = trainer[key]
        if problem := out_of_range(key, value):  # the package's bounds of every record
            raise _bad(path, "trainer.json", problem)
        if key in ("epoch", "batch") and value > step:
            raise _bad(path, "trainer.json", f"`{key}` is {shown(value)}, after the step "
                       f"{step}")
        if key in manifest and manifest[key] != value:
            raise _bad(path, "trainer.json", f"`{key}` is {shown(value)}, {MANIFEST} "
                       f"says {shown(manifest[key])}")
    named = re.fullmatch(r"step-(\d+)", path.name)
    if named and int(named.group(1)) != step:
        raise _bad(path, "trainer.json", f"`step` is {step}, the folder's name says "
                   f"{int(named.group(1))}")


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


def check_fits(snapshot, state, path: Path, schedule_per_step: bool = True) -> None:
    """The checkpoint fits the live training state: its model and optimizer belong to this
    model (same parameter names and shapes, same parameter groups), and every tensor,
    number and switch has the form the live model, optimizer, schedule and scaler take;
    else CorruptCheckpoint saying what differs. `schedule_per_step`: the schedule steps
    once per optimizer step (train's does; a user's own loop may step it per epoch)."""
    live = unwrap(state.model).state_dict()  # FSDP2's DTensors have the global shapes
    _check_model(snapshot, live, path)
    _check_optimizer(snapshot.optimizer, state.optimizer, path,
                     SHARDS_DIR if snapshot.rank_buffers is not None else "optimizer.json")
    trainer = snapshot.trainer
    for key, live_part in (("schedule", state.schedule), ("scaler", state.scaler)):
        problem = _unlike(trainer[key], live_part.state_dict(), f"{key}.")
        if problem:
            raise _bad(path, "trainer.json", problem)
    if schedule_per_step and trainer["schedule"].get("last_epoch") != trainer["step"]:
        raise _bad(path, "trainer.json", f"the schedule is at step "
                   f"{shown(trainer['schedule'].get('last_epoch'))}, the trainer at "
                   f"{trainer['step']}")
    if trainer["scaler"].get("scale", 1) == 0:  # every step skipped, silently
        raise _bad(path, "trainer.json", "the gradient scaler's scale is 0")


def _check_model(snapshot, live: dict, path: Path) -> None:
    where = SHARDS_DIR if snapshot.rank_buffers is not None else MODEL_FILE
    missing = live.keys() - snapshot.model.keys()
    unexpected = snapshot.model.keys() - live.keys()
    reshaped = {k for k in live.keys() & snapshot.model.keys()
                if tuple(live[k].shape) != tuple(snapshot.model[k].shape)}
    if missing or unexpected or reshaped:
        parts = [f"{len(names)} {what} ({_examples(names)})" for names, what in
                 ((missing, "missing"), (unexpected, "unexpected"), (reshaped, "of another shape"))
                 if names]
        raise CorruptCheckpoint(f"{path.name}/{where} holds the weights of another model: "
                                f"{'; '.join(parts)}")
    own = [(name, value) for buffers in snapshot.rank_buffers or [] for name, value in
           buffers.items() if name in live]
    for name, value in [*snapshot.model.items(), *own]:
        problem = _unlike(value, live[name], name)
        if problem:
            raise _bad(path, where, problem)


def _check_optimizer(saved: dict, optimizer, path: Path, where: str) -> None:
    groups = saved["param_groups"]
    live_groups = optimizer.state_dict()["param_groups"]
    counts = [len(g["params"]) if isinstance(g, dict) and isinstance(g.get("params"), list)
              else -1 for g in groups]
    if counts != [len(g["params"]) for g in live_groups]:
        raise CorruptCheckpoint(f"{path.name}: its optimizer state belongs to another model "
                                f"(parameter groups of {counts} parameters, this model has "
                                f"{[len(g['params']) for g in live_groups]})")
    for index, (group, live_group) in enumerate(zip(groups, live_groups)):
        problem = _unlike(group, live_group, f"param_groups.{index}.")
        if problem or group["params"] != live_group["params"]:
            raise _bad(path, where, problem or f"param_groups.{index} numbers its "
                       "parameters otherwise")
    params = [p for group in optimizer.param_groups for p in group["params"]]
    for index, values in saved["state"].items():
        if type(index) is not int or not 0 <= index < len(params):
            raise CorruptCheckpoint(f"{path.name}: the optimizer state names parameters "
                                    "this model does not have")
        for key, value in values.items():
            problem = _state_value(key, value, params[index], f"state.{index}.{shown(key)}")
            if problem:
                raise _bad(path, where, problem)


def _state_value(key, value, param, where: str) -> str | None:
    """An optimizer's per-parameter state: tensors of the parameter's shape and dtype
    (momentum, moments), a one-element `step` count, or None."""
    if value is None:
        return None
    if not isinstance(value, torch.Tensor):
        return f"{where} is {shown(value)}, not a tensor"
    if key == "step" and value.numel() == 1 and not value.dtype.is_complex:
        return None
    if tuple(value.shape) != tuple(param.shape) or value.dtype != param.dtype:
        return (f"{where} is a {value.dtype} tensor of {list(value.shape)}, its parameter a "
                f"{param.dtype} one of {list(param.shape)}")
    return None


def _kind(value) -> str:
    if value is None or isinstance(value, bool):
        return "a switch"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, torch.Tensor):
        return "a tensor"
    if isinstance(value, (list, tuple)):
        return "a list"
    return "a dictionary" if isinstance(value, dict) else f"a {type(value).__name__}"


def _unlike(saved, live, where: str) -> str | None:
    """What in `saved` (read from a checkpoint) has another form than `live` (the live
    object's state dict): keys, kinds, list lengths, tensor shapes and dtypes; numbers
    must be finite and not negative (learning rates, momenta, decays, steps, scales: a
    negative one would train backwards). A switch (True, False, None) may be missing: an
    older torch did not
    write the ones added since, and the loaders set their defaults."""
    if _kind(saved) != _kind(live):
        return f"{where.rstrip('.')} is {_kind(saved)} ({shown(saved)}), expected {_kind(live)}"
    if isinstance(live, dict):
        for key, value in live.items():
            if key not in saved and _kind(value) != "a switch":
                return f"{where}{key} is missing"
        for key in saved.keys() - live.keys():
            if _kind(saved[key]) != "a switch":
                return f"{where}{shown(key)} is not part of this state"
        return next(filter(None, (_unlike(saved[k], v, f"{where}{k}.") for k, v in live.items()
                                  if k in saved)), None)
    if isinstance(live, (list, tuple)):
        if len(saved) != len(live):
            return f"{where.rstrip('.')} holds {len(saved)} values, expected {len(live)}"
        return next(filter(None, (_unlike(s, v, f"{where}{i}.") for i, (s, v) in
                                  enumerate(zip(saved, live)))), None)
    if isinstance(live, torch.Tensor) and (saved.shape != live.shape or saved.dtype != live.dtype):
        return (f"{where.rstrip('.')} is a {saved.dtype} tensor of {list(saved.shape)}, "
                f"expected {live.dtype} of {list(live.shape)}")
    if _kind(saved) == "a number" and not (math.isfinite(saved) and saved >= 0):
        return f"{where.rstrip('.')} is {saved}, not a finite number of 0 or more"
    return None


# --- random states ------------------------------------------------------------
# What rng.json holds per rank (workload.checkpoint.snapshot takes and sets them).
RNG_KEYS = ("torch", "numpy", "python")  # and "cuda" where CUDA was there


def numpy_state(n: dict) -> tuple:
    return (n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"],
            n["cached"])


def python_state(p: dict) -> tuple:
    return (p["version"], tuple(p["internal"]), p["gauss_next"])


def _is_number(value, low: float, high: float) -> bool:
    return type(value) in (int, float) and low <= value <= high


def check_states(states) -> None:
    """ValueError saying what is wrong when `states` (one rank's, read from a checkpoint)
    cannot be set. The forms are tried on throwaway generators (the global ones are
    untouched); what they do not check is checked here first (numpy takes a position past
    its 624 keys without a word and then crashes the process)."""
    if not (isinstance(states, dict) and all(k in states for k in RNG_KEYS)):
        raise ValueError(f"not a dictionary of random states ({', '.join(RNG_KEYS)})")
    n = states["numpy"]
    t = states["torch"]
    if not (isinstance(t, torch.Tensor) and t.dtype == torch.uint8 and t.dim() == 1):
        raise ValueError("torch's state is not a uint8 tensor")
    keys = n.get("keys") if isinstance(n, dict) else None
    if not (isinstance(keys, torch.Tensor) and keys.dtype == torch.int64
            and keys.shape == (624,) and 0 <= int(keys.min()) <= int(keys.max()) < 2**32):
        raise ValueError("numpy's state has no 624 keys of 32 bits")
    if not (_is_number(n.get("pos"), 0, 624) and n.get("has_gauss") in (0, 1)
            and _is_number(n.get("cached"), -math.inf, math.inf)):
        raise ValueError("numpy's state has a position, has_gauss or cached value out of range")
    try:
        torch.Generator().set_state(t)
        np.random.RandomState().set_state(numpy_state(n))
        random.Random().setstate(python_state(states["python"]))
    except (KeyError, TypeError, ValueError, OverflowError, RuntimeError,
            AttributeError) as error:
        raise ValueError(f"a state torch, numpy or python cannot take ({str(error)[:120]})"
                         ) from None
    _check_cuda(states.get("cuda", []))


def _check_cuda(cuda) -> None:
    """CUDA states: uint8 tensors, of the size this torch's generators take where there
    are GPUs (set_states applies them only then)."""
    if not (isinstance(cuda, list) and all(isinstance(c, torch.Tensor) and c.dtype == torch.uint8
                                           and c.dim() == 1 for c in cuda)):
        raise ValueError("the CUDA states are not a list of uint8 tensors")
    if cuda and torch.cuda.is_available():
        size = torch.cuda.get_rng_state().shape
        if any(c.shape != size for c in cuda):
            raise ValueError(f"the CUDA states are not of {size[0]} bytes each")
