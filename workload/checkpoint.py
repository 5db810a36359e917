"""Atomic, verified checkpoints, and finding the one to resume from.

Layout of `<output-dir>/checkpoints/`:
    step-000000120/        one complete checkpoint (the name is the optimizer step)
        model.pt           the model's state dict
        optimizer.pt       the optimizer's state dict
        trainer.pt         LR schedule, grad scaler, epoch, batch within the epoch, step,
                           accuracies so far, world size
        rng.pt             RNG states of every rank: torch CPU, CUDA, numpy, python random
        config.json        the resolved config
        MANIFEST.json      size and sha256 of every file above: written last
    latest                 the name of the newest complete checkpoint (replaced atomically)
    step-000000100.corrupt-20261122-161500/   a bad one, moved aside and never deleted

With FSDP, `sharded/` holds DCP's files (every rank writes its shard) in place of model.pt
and optimizer.pt. A save writes into `.tmp-step-...` beside the others (same filesystem, so the rename is
atomic), fsyncs every file, writes the manifest, renames the directory into place, fsyncs
the parent, replaces `latest`, and only then prunes the oldest beyond --keep-checkpoints.
A crash at any moment leaves either the previous checkpoints or the new one complete.
Loading verifies the manifest, then reads every file with torch.load(weights_only=True):
no code in a checkpoint ever runs.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from workload import distributed, rng
from workload.checkpoint_sharded import (METADATA, SHARDED_DIR, load_sharded,
                                         read_metadata_safely, save_sharded)
from workload.errors import UsageError
from workload.logs import logger
from workload.records import unwrap

MANIFEST = "MANIFEST.json"
REQUIRED_FILES = ("model.pt", "optimizer.pt", "trainer.pt", "rng.pt", "config.json")
# FSDP: model and optimizer as DCP shards instead of model.pt and optimizer.pt.
SHARDED_REQUIRED_FILES = (f"{SHARDED_DIR}/{METADATA}", "trainer.pt", "rng.pt", "config.json")
FORMAT_VERSION = 1
_STEP_DIR = re.compile(r"^step-(\d+)$")
_UNSAFE_LOAD_ENV = "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"


class CorruptCheckpoint(Exception):
    """A checkpoint that is incomplete, altered or unsafe; the message says which file."""


# --- flags ---------------------------------------------------------------------------------

_UNITS = {"s": 1, "m": 60, "h": 3600}


def parse_every(text: str) -> tuple[int, float]:
    """`--checkpoint-every`: "500" -> (500 steps, 0 s); "10m" -> (0 steps, 600 s); "0" -> off."""
    match = re.fullmatch(r"\s*(\d+)\s*([smh]?)\s*", str(text))
    if not match:
        raise UsageError(f"--checkpoint-every {text!r} is neither a step count nor a duration; "
                         "pass e.g. --checkpoint-every 500 (steps) or 10m (also 90s, 1h)")
    number, unit = int(match.group(1)), match.group(2)
    return (0, float(number * _UNITS[unit])) if unit else (number, 0.0)


def check_checkpoint_flags(cfg) -> None:
    """The checkpoint flags' part of TrainConfig.validate."""
    refuse_unsafe_load_env()
    parse_every(cfg.checkpoint_every)
    if not (isinstance(cfg.keep_checkpoints, int) and cfg.keep_checkpoints >= 1):
        raise UsageError(f"--keep-checkpoints must be 1 or more, got {cfg.keep_checkpoints!r}; "
                         "pass e.g. --keep-checkpoints 3")
    if cfg.resume not in ("auto", "never") and not Path(cfg.resume).is_dir():
        raise UsageError(f"--resume {cfg.resume} is not a checkpoint directory; pass auto, "
                         "never, or a folder such as <output-dir>/checkpoints/step-000000120")
    if cfg.overwrite and cfg.resume != "never":
        raise UsageError("--overwrite replaces the checkpoints in the output directory and "
                         f"only goes with --resume never (got --resume {cfg.resume})")


def refuse_unsafe_load_env() -> None:
    """torch.load ignores weights_only=True when this variable is set: refuse to start."""
    value = os.environ.get(_UNSAFE_LOAD_ENV, "")
    if value not in ("", "0"):
        raise UsageError(f"{_UNSAFE_LOAD_ENV}={value} makes torch.load unpickle arbitrary "
                         "code from checkpoint files; unset it (checkpoints here never need it)")


# --- files ---------------------------------------------------------------------------------

def checkpoints_dir(out: Path) -> Path:
    return Path(out) / "checkpoints"


def step_name(step: int) -> str:
    return f"step-{step:09d}"


def complete_steps(root: Path) -> list[tuple[int, Path]]:
    """(step, folder) of every folder named like a complete checkpoint, oldest first."""
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir()
             if (m := _STEP_DIR.match(p.name)) and p.is_dir()]
    return sorted(found)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_durably(path: Path, write) -> dict:
    """Write through `write(file)`, fsync, and return the manifest entry of the file."""
    with open(path, "wb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())
    return dict(bytes=path.stat().st_size, sha256=sha256_file(path))


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _json_bytes(data: dict) -> bytes:
    return (json.dumps(data, indent=2, sort_keys=True) + "\n").encode()


def _replace_latest(root: Path, name: str) -> None:
    tmp = root / f".latest.tmp-{os.getpid()}"
    _write_durably(tmp, lambda f: f.write(name.encode() + b"\n"))
    os.replace(tmp, root / "latest")
    _fsync_dir(root)


def move_aside(path: Path, why: str) -> Path:
    """Rename a bad checkpoint to `<step name>.<why>-<time>`: kept for inspection, never
    deleted, and no longer a candidate for resuming."""
    match = re.match(r"^\.?(?:tmp-)?(step-\d+)", path.name)
    base = match.group(1) if match else path.name
    target = path.with_name(f"{base}.{why}-{time.strftime('%Y%m%d-%H%M%S')}")
    suffix = 1
    while target.exists():
        target = target.with_name(f"{target.name.split('~')[0]}~{suffix}")
        suffix += 1
    os.replace(path, target)
    return target


# --- saving ---------------------------------------------------------------------------------

@dataclass
class Snapshot:
    """What a checkpoint holds, gathered on rank 0 (RNG states come from every rank).
    `model` and `optimizer` are None when FSDP shards are written through DCP instead."""
    model: dict | None
    optimizer: dict | None
    trainer: dict
    rng: list[dict]
    config: dict


def take_snapshot(state, cfg, world_size: int, sharded: bool) -> Snapshot:
    """A collective (the RNG states of every rank are gathered): all ranks call it."""
    trainer = dict(format=FORMAT_VERSION, schedule=state.schedule.state_dict(),
                   scaler=state.scaler.state_dict(), epoch=state.epoch, batch=state.batch,
                   step=state.step, accuracies=list(state.accuracies), world_size=world_size)
    if sharded:
        # FSDP keeps buffers (BatchNorm statistics) per rank and DCP saves one copy of
        # them: every rank's own are kept here so that each gets its own back.
        buffers = {name: b for name, b in state.model.named_buffers()}
        trainer["rank_buffers"] = rng.gather(buffers, world_size)
        return Snapshot(None, None, trainer, rng.gather_states(world_size), cfg.to_dict())
    return Snapshot(unwrap(state.model).state_dict(), state.optimizer.state_dict(), trainer,
                    rng.gather_states(world_size), cfg.to_dict())


def save_checkpoint(root: Path, snapshot: Snapshot, keep: int, is_main: bool,
                    sharded_state=None) -> Path:
    """All ranks call it. Rank 0 writes (the others wait), except FSDP shards, which every
    rank writes into the same temporary folder first."""
    tmp = root / f".tmp-{step_name(snapshot.trainer['step'])}"
    if is_main:
        root.mkdir(parents=True, exist_ok=True)
        if tmp.exists():  # left by a run killed while saving this very step
            move_aside(tmp, "incomplete")
        tmp.mkdir()
    if sharded_state is not None:
        distributed.barrier()  # the folder exists before anyone writes into it
        save_sharded(sharded_state.model, sharded_state.optimizer, tmp / SHARDED_DIR)
    final = root / step_name(snapshot.trainer["step"])
    if is_main:
        finish_checkpoint(tmp, final, snapshot, keep)
    distributed.barrier()  # the others wait until the checkpoint is complete
    return final


def finish_checkpoint(tmp: Path, final: Path, snapshot: Snapshot, keep: int) -> None:
    """Rank 0: the remaining files, the manifest last, rename, `latest`, then pruning."""
    root = final.parent
    parts = [("trainer.pt", snapshot.trainer), ("rng.pt", snapshot.rng)]
    if snapshot.model is not None:
        parts = [("model.pt", snapshot.model), ("optimizer.pt", snapshot.optimizer), *parts]
    for name, obj in parts:
        _write_durably(tmp / name, lambda f, obj=obj: torch.save(obj, f))
    _write_durably(tmp / "config.json", lambda f: f.write(_json_bytes(snapshot.config)))
    files = {str(p.relative_to(tmp)): dict(bytes=p.stat().st_size, sha256=sha256_file(p))
             for p in sorted(tmp.rglob("*")) if p.is_file()}
    manifest = dict(format=FORMAT_VERSION, step=snapshot.trainer["step"],
                    epoch=snapshot.trainer["epoch"], batch=snapshot.trainer["batch"],
                    sharded=snapshot.model is None,
                    created=time.strftime("%Y-%m-%dT%H:%M:%S%z"), files=files)
    _write_durably(tmp / MANIFEST, lambda f: f.write(_json_bytes(manifest)))
    _fsync_dir(tmp)
    _rename_into_place(tmp, final)
    _fsync_dir(root)
    _replace_latest(root, final.name)
    prune(root, keep, newest=snapshot.trainer["step"])


def _rename_into_place(tmp: Path, final: Path) -> None:
    """os.replace cannot replace a non-empty folder: an older save of the same step (the
    epoch end after a preemption save) is renamed away first, then removed."""
    if final.exists():
        old = final.with_name(f".replaced-{final.name}-{os.getpid()}")
        os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old)
    else:
        os.replace(tmp, final)


def prune(root: Path, keep: int, newest: int) -> None:
    """Remove complete checkpoints older than the newest `keep` up to step `newest`."""
    older = [path for step, path in complete_steps(root) if step <= newest]
    for path in older[:-keep]:
        shutil.rmtree(path)


# --- loading -------------------------------------------------------------------------------

def verify(path: Path) -> dict:
    """The manifest of a complete, unaltered checkpoint, or CorruptCheckpoint saying why."""
    manifest_path = path / MANIFEST
    if not manifest_path.is_file():
        raise CorruptCheckpoint(f"{path.name} has no {MANIFEST} (a save that did not finish)")
    try:
        manifest = json.loads(manifest_path.read_text())
        files = manifest["files"]
    except (ValueError, KeyError, TypeError):
        raise CorruptCheckpoint(f"{path.name}/{MANIFEST} is not a readable manifest") from None
    sharded = bool(manifest.get("sharded"))
    for name in REQUIRED_FILES if not sharded else SHARDED_REQUIRED_FILES:
        if name not in files:
            raise CorruptCheckpoint(f"{path.name}/{MANIFEST} does not list {name}")
    for name, entry in files.items():
        _verify_file(path, name, entry)
    return manifest


def _verify_file(path: Path, name: str, entry: dict) -> None:
    file = path / name
    if not file.is_file():
        raise CorruptCheckpoint(f"{path.name}/{name} is missing")
    size = file.stat().st_size
    if size != entry.get("bytes"):
        raise CorruptCheckpoint(f"{path.name}/{name} has {size} bytes, the manifest says "
                                f"{entry.get('bytes')} (truncated or overwritten)")
    if sha256_file(file) != entry.get("sha256"):
        raise CorruptCheckpoint(f"{path.name}/{name} does not match its sha256 in the "
                                "manifest (changed after it was written)")


def safe_load(file: Path, device) -> object:
    """torch.load with weights_only=True, and nothing else: a file holding anything but
    tensors, numbers, strings and containers is refused before any of it runs."""
    try:
        return torch.load(file, map_location=device, weights_only=True)
    except Exception as error:  # UnpicklingError, RuntimeError (bad zip), EOFError, ...
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise CorruptCheckpoint(f"{file.parent.name}/{file.name} cannot be loaded safely "
                                f"(torch.load weights_only=True refused it: {first})") from None


def read_checkpoint(path: Path, device) -> Snapshot:
    """Verify and load every file of one checkpoint (tensors onto `device`); FSDP shards
    are only checked here and read by every rank in `restore`."""
    manifest = verify(path)
    names = ["trainer.pt", "rng.pt"]
    if manifest.get("sharded"):
        try:
            read_metadata_safely(path / SHARDED_DIR)
        except Exception as error:  # UnsafeMetadata, UnpicklingError, EOFError, ...
            raise CorruptCheckpoint(f"{path.name}/{SHARDED_DIR}/{METADATA} cannot be read "
                                    f"safely: {error}") from None
    else:
        names = ["model.pt", "optimizer.pt", *names]
    loaded = {name: safe_load(path / name, "cpu" if name == "rng.pt" else device)
              for name in names}
    config = json.loads((path / "config.json").read_text())
    return Snapshot(loaded.get("model.pt"), loaded.get("optimizer.pt"), loaded["trainer.pt"],
                    loaded["rng.pt"], config)


def restore(snapshot: Snapshot, state, rank: int, world_size: int, path: Path) -> None:
    """Put a loaded checkpoint into the live training state of this rank (a collective
    for FSDP shards)."""
    trainer = snapshot.trainer
    if snapshot.model is None:
        load_sharded(state.model, state.optimizer, path / SHARDED_DIR)
        own = trainer["rank_buffers"][rank % len(trainer["rank_buffers"])]
        with torch.no_grad():
            for name, buffer in state.model.named_buffers():
                buffer.copy_(own[name])
    else:
        unwrap(state.model).load_state_dict(snapshot.model)
        state.optimizer.load_state_dict(snapshot.optimizer)
    state.schedule.load_state_dict(trainer["schedule"])
    state.scaler.load_state_dict(trainer["scaler"])
    state.epoch, state.batch, state.step = trainer["epoch"], trainer["batch"], trainer["step"]
    state.accuracies[:] = trainer["accuracies"]
    if trainer["world_size"] != world_size:
        logger.warning(f"the checkpoint was written by {trainer['world_size']} processes, this "
                       f"run has {world_size}: training continues, but the data order from "
                       "here differs from an uninterrupted run")
    rng.set_states(snapshot.rng[rank % len(snapshot.rng)])
