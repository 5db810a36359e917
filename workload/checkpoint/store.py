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

import json
import os
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from workload.checkpoint.sharded import METADATA, SHARDED_DIR
from workload.files import json_text, sha256_file

MANIFEST = "MANIFEST.json"
REQUIRED_FILES = ("model.pt", "optimizer.pt", "trainer.pt", "rng.pt", "config.json")
# FSDP: model and optimizer as DCP shards instead of model.pt and optimizer.pt.
SHARDED_REQUIRED_FILES = (f"{SHARDED_DIR}/{METADATA}", "trainer.pt", "rng.pt", "config.json")
FORMAT_VERSION = 1
_STEP_DIR = re.compile(r"^step-(\d+)$")
# A folder moved aside: step-000000100.corrupt-20261122-161500 (or ~1, ~2 after it).
_ASIDE_DIR = re.compile(r"^(step-\d+)\.(corrupt|incomplete)-(\d{8}-\d{6})(~\d+)?$")
# How many moved-aside folders of each kind are kept for inspection; older ones are deleted
# after each save, so that a run that keeps failing cannot fill the disk with them.
KEEP_ASIDE = 3


class CorruptCheckpoint(Exception):
    """A checkpoint that is incomplete, altered or unsafe; the message says which file."""


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
             if (m := _STEP_DIR.match(p.name)) and p.is_dir() and not p.is_symlink()]
    return sorted(found)


def symlinked_steps(root: Path) -> list[Path]:
    """Step folders that are symbolic links: never loaded, pruned or followed to delete
    (a checkpoint is a folder of the run, not a pointer to somewhere else)."""
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if _STEP_DIR.match(p.name) and p.is_symlink())


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


def _json_bytes(data: dict) -> bytes:
    return (json_text(data, indent=2) + "\n").encode()


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
    if final.exists() or final.is_symlink():
        old = final.with_name(f".replaced-{final.name}-{os.getpid()}")
        os.replace(final, old)
        os.replace(tmp, final)
        remove_tree(old)
    else:
        os.replace(tmp, final)


def prune(root: Path, keep: int, newest: int) -> None:
    """Remove complete checkpoints older than the newest `keep` up to step `newest`."""
    older = [path for step, path in complete_steps(root) if step <= newest]
    for path in older[:-keep]:
        remove_tree(path)
    prune_aside(root)


def remove_tree(path: Path) -> None:
    """Delete a folder of the run; a symbolic link is removed itself, never followed."""
    if path.is_symlink():
        path.unlink()
    else:
        shutil.rmtree(path)


def prune_aside(root: Path, keep: int = KEEP_ASIDE) -> None:
    """Keep the newest `keep` folders moved aside of each kind (`.corrupt-`,
    `.incomplete-`), by the time in their names; delete older ones. Symbolic links are
    left alone."""
    kinds: dict[str, list[tuple[str, Path]]] = {}
    for path in root.iterdir() if root.is_dir() else []:
        match = _ASIDE_DIR.match(path.name)
        if match and path.is_dir() and not path.is_symlink():
            kinds.setdefault(match.group(2), []).append((match.group(3) + path.name, path))
    for found in kinds.values():
        for _, path in sorted(found)[:-keep]:
            shutil.rmtree(path, ignore_errors=True)


# --- loading -------------------------------------------------------------------------------

def verify(path: Path) -> dict:
    """The manifest of a complete, unaltered checkpoint, or CorruptCheckpoint saying why."""
    manifest_path = path / MANIFEST
    if not manifest_path.is_file():
        raise CorruptCheckpoint(f"{path.name} has no {MANIFEST} (a save that did not finish)")
    try:
        manifest = json.loads(manifest_path.read_text())
        files = manifest["files"]
    except (ValueError, KeyError, TypeError, UnicodeDecodeError):
        raise CorruptCheckpoint(f"{path.name}/{MANIFEST} is not a readable manifest") from None
    if not _well_typed(files):
        raise CorruptCheckpoint(f"{path.name}/{MANIFEST} is not a manifest: `files` must map "
                                "file names to their bytes (a number) and sha256 (text)")
    sharded = bool(manifest.get("sharded"))
    for name in REQUIRED_FILES if not sharded else SHARDED_REQUIRED_FILES:
        if name not in files:
            raise CorruptCheckpoint(f"{path.name}/{MANIFEST} does not list {name}")
    for name, entry in files.items():
        _verify_file(path, name, entry)
    return manifest


def _well_typed(files) -> bool:
    return isinstance(files, dict) and all(
        isinstance(name, str) and isinstance(entry, dict)
        and type(entry.get("bytes")) is int and isinstance(entry.get("sha256"), str)
        for name, entry in files.items())


def inside(folder: Path, name: str) -> Path:
    """`folder/name` when it stays inside `folder` (no absolute name, no `..`, no link out
    of it), else CorruptCheckpoint: a manifest never names a file elsewhere."""
    relative = Path(name)
    if relative.is_absolute() or ".." in relative.parts or not name.strip():
        raise CorruptCheckpoint(f"{folder.name}/{MANIFEST} names {name!r}, which is not a "
                                "file inside the checkpoint folder")
    file = folder / relative
    if not file.resolve().is_relative_to(folder.resolve()):
        raise CorruptCheckpoint(f"{folder.name}/{name} leads outside the checkpoint folder "
                                f"(to {file.resolve()}); refusing to read it")
    return file


def _verify_file(path: Path, name: str, entry: dict) -> None:
    file = inside(path, name)
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


