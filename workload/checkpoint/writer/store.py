"""Atomic, verified checkpoints: one step folder, written and read back.

Layout of one checkpoint in `<output-dir>/checkpoints/` (every file safetensors or JSON;
the folder around it, `latest` and the ones moved aside: workload.checkpoint.writer.folder):
    step-000000120/         one complete checkpoint (the name is the optimizer step)
        model.safetensors   the model's state dict (single process, DDP)
        optimizer.json      the optimizer's state dict, tensors as references into
        optimizer.safetensors   its tensors (SGD's momentum buffers ...)
        trainer.json        LR schedule, grad scaler, epoch, batch within the epoch, step,
                            accuracies so far, world size
        rng.json            RNG states of every rank: torch CPU and CUDA (uint8 tensors in
        rng.safetensors     rng.safetensors), numpy, python random
        config.json         the resolved config
        MANIFEST.json       size and sha256 of every file above: written last

With FSDP, `shards/rank-NNNNN.safetensors` and `shards/rank-NNNNN.json` (every rank writes
its own: its rows of each parameter and optimizer state, and the layout) take the place of
model.safetensors and optimizer.*. A save writes into `.tmp-step-...` beside the others
(same filesystem, so the rename is atomic), the manifest last, and fsyncs every file and
the folder, all at once (`finish_checkpoint`); the folder's `publish` then commits it
(workload.checkpoint.writer.folder: the commit point). Loading verifies the manifest (read as
strict JSON, its names plain ones inside the folder) and refuses a JSON file that starts
like a pickle or a zip archive; nothing is ever unpickled.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path

from workload.checkpoint.writer.durable import (CorruptCheckpoint, Syncs, read_json, record_bytes,
                                                sniff, write_soon)
from workload.checkpoint.writer.diskfull import guarded_copy
from workload.checkpoint.writer.folder import move_aside, prune, publish
from workload.files import create_new, open_regular, sha256_file
from workload.held import let_go, make_held
from workload.logs import say, shown

MANIFEST = "MANIFEST.json"
SHARDS_DIR = "shards"
MODEL_FILE = "model.safetensors"
COMMON_FILES = ("trainer.json", "rng.json", "config.json")
REQUIRED_FILES = (MODEL_FILE, "optimizer.json", *COMMON_FILES)
# FSDP: every rank's shard file instead of model.safetensors and optimizer.*.
SHARDED_REQUIRED_FILES = (f"{SHARDS_DIR}/rank-00000.json", *COMMON_FILES)
FORMAT_VERSION = 2  # 1: torch.save files (model.pt, ...), refused since; 2: safetensors, JSON
OLD_FORMAT_FILES = ("model.pt", "optimizer.pt", "trainer.pt", "rng.pt")
# What a manifest may name: the files a save writes are plain ASCII names, at most one
# folder deep (shards/rank-00000.json); anything else is an edited manifest.
_FILE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}(/[A-Za-z0-9_][A-Za-z0-9_.-]{0,99})?")


class OldFormat(Exception):
    """A checkpoint written by an earlier version in the torch.save format."""


# --- saving ---------------------------------------------------------------------------------

# A file of a checkpoint: its bytes, or a function that writes it at the path it is given,
# hands its fsync to the Syncs it is given, and returns its manifest entry as a Future
# (the writer process's safetensors files).
FileContent = bytes | Callable[[Path, Syncs], Future]


@dataclass
class Snapshot:
    """What a checkpoint holds, gathered on rank 0 (RNG states come from every rank).
    `model` and `optimizer` are None when every rank writes its FSDP shard instead; read
    back, they are the full state dicts, and `rank_buffers` each rank's own buffers
    (BatchNorm statistics, which FSDP keeps per rank)."""
    model: dict | None
    optimizer: dict | None
    trainer: dict
    rng: list[dict]
    config: dict
    rank_buffers: list[dict] | None = None


def header(snapshot: Snapshot) -> dict:
    """What the manifest says of a checkpoint besides its files."""
    trainer = snapshot.trainer
    return dict(step=trainer["step"], epoch=trainer["epoch"], batch=trainer["batch"],
                sharded=snapshot.model is None, world_size=trainer["world_size"])


def finish_checkpoint(tmp: Path, final: Path, files: Iterable[tuple[str, FileContent]],
                      head: dict, shard_files: dict | None = None) -> None:
    """Rank 0 or its writer process: `files` (in writing order: see workload.checkpoint.
    snapshot's `checkpoint_files`), the manifest last, then the commit (folder.publish;
    pruning is the caller's: `end_save`). `head`: `header` of the
    snapshot; `shard_files`: the manifest entries of the FSDP shards every rank wrote,
    gathered. Torch-free: the writer process runs it on tensors
    it never turns into torch's."""
    entries = dict(shard_files or {})
    # Every file's fsync and the folders' are issued as the files are written and waited
    # for together (durable.Syncs): the rename into place needs all of them and no order
    # among them, since nothing reads `.tmp-step-N` before the rename. The large files'
    # hashes are taken likewise, each beside the next file's write; the manifest is still
    # written last, as it lists them.
    with Syncs() as syncs:
        if (tmp / SHARDS_DIR).is_dir():
            syncs.folder(tmp / SHARDS_DIR)
        written = {name: (content(tmp / name, syncs) if callable(content)
                          else write_soon(tmp / name, content, syncs))
                   for name, content in files}
        entries.update({name: entry.result() for name, entry in written.items()})
        manifest = dict(format=FORMAT_VERSION, **head,
                        created=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                        files=dict(sorted(entries.items())))
        write_soon(tmp / MANIFEST, record_bytes(manifest), syncs)
        syncs.folder(tmp)
    publish(tmp, final)


# --- how every save ends --------------------------------------------------------------

def end_save(final: Path, keep: int, copy_to: Path | None = None,
             committed: Callable[[Path], None] | None = None) -> Path:
    """How every save ends once `finish_checkpoint` committed it, in the trainer or in
    the writer process, with a local tier or without: the checkpoint `final` copied into
    the run folder's checkpoints `copy_to` (when `final` is the local tier's), then the
    checkpoints older than the newest `keep` pruned in each folder that holds it. Its
    path in the run folder. `committed` is told that path before the pruning (the writer
    process answers the loop then, so that the loop never waits for the pruning); a
    pruning that fails once it was told is said on stderr, and the
    next save's pruning tries again."""
    folders = [final.parent]
    if copy_to is not None:
        folders.append(copy_to_run(final, copy_to).parent)
    saved = folders[-1] / final.name
    if committed is not None:
        committed(saved)
    for folder in folders:
        try:
            prune(folder, keep, newest=int(final.name.removeprefix("step-")))
        except OSError as error:
            if committed is None:
                raise
            say(f"checkpoint writer: could not prune the older checkpoints in {folder}: "
                f"{error}", sys.stderr)
    return saved


def copy_to_run(path: Path, run_root: Path) -> Path:
    """Copy the committed checkpoint `path` into the run folder with the same commit
    (folder.publish; pruning is `end_save`'s); a full disk there in one line
    (workload.checkpoint.writer.diskfull)."""
    final = run_root / path.name
    tmp = run_root / f".tmp-{path.name}"
    run_root.mkdir(parents=True, exist_ok=True)
    if tmp.exists() or tmp.is_symlink():  # left by a job that ended while copying
        move_aside(tmp, "incomplete")
    # Private while written (see folder.publish), and reached only through its descriptor:
    # the run folder's checkpoints may be written by others (workload.held.make_held).
    held = make_held(tmp)
    try:
        with guarded_copy(run_root, held, path):
            _copy_durably(path, held)
            verify(held)  # the copy is what the manifest says, before it takes its place
            publish(held, final)
    finally:
        let_go(held)
    return final


def _copy_durably(source: Path, target: Path) -> None:
    """Every file of `source` copied into the new private folder `target`, each created
    anew (never through a link); every file and folder fsynced, all at once
    (durable.Syncs: the commit needs them all and no order among them)."""
    with Syncs() as syncs:
        for file in sorted(source.rglob("*")):
            dest = target / file.relative_to(source)
            if file.is_dir():
                dest.mkdir()
                continue
            with (open(open_regular(file, follow_links=False), "rb") as reader,
                  os.fdopen(create_new(dest), "wb") as copied):
                shutil.copyfileobj(reader, copied, 1 << 20)
                copied.flush()
                syncs.file(os.dup(copied.fileno()))
        for folder in [target, *(p for p in target.rglob("*") if p.is_dir())]:
            syncs.folder(folder)


# --- loading -------------------------------------------------------------------------------

def verify(path: Path) -> dict:
    """The manifest of a complete, unaltered checkpoint, or CorruptCheckpoint saying why
    (OldFormat for one of the torch.save format)."""
    manifest, files = _read_manifest(path)
    if not _well_typed(files):
        raise CorruptCheckpoint(f"{path.name}/{MANIFEST} is not a manifest: `files` must map "
                                "file names to their bytes (a number) and sha256 (text)")
    sharded = bool(manifest.get("sharded"))
    for name in REQUIRED_FILES if not sharded else SHARDED_REQUIRED_FILES:
        if name not in files:
            raise CorruptCheckpoint(f"{path.name}/{MANIFEST} does not list {name}")
    for name, entry in files.items():
        _verify_file(path, name, entry)
    _only_listed(path, files)
    return manifest


def _only_listed(path: Path, files: dict) -> None:
    """A checkpoint holds the files of its manifest and nothing else: a file planted
    beside them is refused, as is any that starts like a pickle or a zip archive."""
    for folder, _, names in os.walk(path):
        for file in (Path(folder) / name for name in names):
            name = file.relative_to(path).as_posix()
            if name != MANIFEST and name not in files:  # a plain name as is, else escaped
                named = name if _FILE_NAME.fullmatch(name) else shown(name)
                raise CorruptCheckpoint(f"{path.name}/{named} is not listed in the manifest "
                                        "(a checkpoint holds nothing else); refusing it")
            if file.is_file() and not file.is_symlink():
                sniff(file)


def _read_manifest(path: Path) -> tuple[dict, object]:
    manifest_path = path / MANIFEST
    old_files = any((path / name).exists() for name in OLD_FORMAT_FILES)
    if not manifest_path.is_file():
        if old_files:  # an unfinished save of the old format: not resumable either
            raise OldFormat(old_format_message(path))
        raise CorruptCheckpoint(f"{path.name} has no {MANIFEST} (a save that did not finish)")
    try:
        manifest = read_json(manifest_path)
        files = manifest["files"]
        version = manifest.get("format")
    except (CorruptCheckpoint, KeyError, TypeError, AttributeError) as error:
        why = f" ({error})" if isinstance(error, CorruptCheckpoint) else ""
        raise CorruptCheckpoint(f"{path.name}/{MANIFEST} is not a readable manifest"
                                f"{why}") from None
    if version != FORMAT_VERSION:
        if version == 1 or old_files:
            raise OldFormat(old_format_message(path))
        raise CorruptCheckpoint(f"{path.name}/{MANIFEST} says format {version!r}; this "
                                f"version reads format {FORMAT_VERSION}")
    return manifest, files


def old_format_message(path: Path) -> str:
    return (f"{path} was written by an earlier version in the torch.save format, which is "
            "no longer read (it would need an unpickler); start afresh with --resume never "
            "--overwrite or a new --output-dir (nothing was moved or deleted)")


def _well_typed(files) -> bool:
    return isinstance(files, dict) and all(
        isinstance(name, str) and isinstance(entry, dict)
        and type(entry.get("bytes")) is int and isinstance(entry.get("sha256"), str)
        for name, entry in files.items())


def inside(folder: Path, name: str) -> Path:
    """`folder/name` when it stays inside `folder` (a plain name, no `..`, no link out of
    it), else CorruptCheckpoint: a manifest never names a file elsewhere, nor one no save
    writes (a NUL byte, 5000 characters, a lone surrogate)."""
    if not _FILE_NAME.fullmatch(name):  # no part starts with ".": no ".." either
        raise CorruptCheckpoint(f"{folder.name}/{MANIFEST} names {shown(name)}, which is not "
                                "a file inside the checkpoint folder (a save writes plain "
                                "names of letters, digits, '.', '_' and '-')")
    # No link on the way, looked at from the folder (held or not) itself: resolving the
    # folder's name and the file's apart raced a neighbour's rename of a held folder.
    here = folder
    for part in Path(name).parts:
        here = here / part
        if here.is_symlink():
            raise CorruptCheckpoint(f"{folder.name}/{name} is a link (a save writes none), "
                                    "which may lead outside the checkpoint folder; refusing "
                                    "to read it")
    return here


def _verify_file(path: Path, name: str, entry: dict) -> None:
    file = inside(path, name)
    if not file.is_file():
        raise CorruptCheckpoint(f"{path.name}/{name} is missing")
    sniff(file)  # a JSON file that is a pickle or a zip is named as such, whatever its size
    size = file.stat().st_size
    if size != entry.get("bytes"):
        raise CorruptCheckpoint(f"{path.name}/{name} has {size} bytes, the manifest says "
                                f"{entry.get('bytes')} (truncated or overwritten)")
    if sha256_file(file) != entry.get("sha256"):
        raise CorruptCheckpoint(f"{path.name}/{name} does not match its sha256 in the "
                                "manifest (changed after it was written)")
