"""The in-process save: the checkpoint written by this process (and, under FSDP2, every
rank's shard by its own), as against the writer process's (workload.checkpoint.writer.process).
`save_checkpoint` is the collective save, `make_save_folder` and `write_checkpoint` the
two halves rank 0 runs alone when a save meant for the writer process cannot be handed
over. Which of them a
save takes is workload.checkpoint.session's to decide; when to save, saving's.

Both end as every save ends (workload.checkpoint.writer.store's `end_save`), and the
commit is the same (workload.checkpoint.writer.folder: the commit point). A full disk: one line
that names the folder and the space, the partial folder removed
(workload.checkpoint.writer.diskfull).
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import torch

from workload import distributed
from workload.checkpoint.writer.diskfull import guarded_save
from workload.checkpoint.writer.folder import move_aside, step_name
from workload.checkpoint.formats import as_bytes
from workload.checkpoint.snapshot import checkpoint_files, save_shards
from workload.checkpoint.writer.store import (SHARDS_DIR, Snapshot, end_save, finish_checkpoint,
                                              header)
from workload.held import (hold_by_inode, let_go, make_held, named_for_the_user,
                           remove_held)

# What may hold a tensor (the rest, such as a loop's millions of numbers, is passed by).
HOLDERS = (torch.Tensor, dict, list, tuple)


def tensor_bytes(value) -> int:
    """The bytes of every tensor in nested dicts and lists."""
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, dict):
        value = value.values()
    elif not isinstance(value, (list, tuple)):
        return 0
    return sum(tensor_bytes(v) for v in value if isinstance(v, HOLDERS))


def snapshot_bytes(snapshot: Snapshot) -> int:
    """The bytes of a snapshot's tensors: about what its checkpoint takes on disk."""
    return tensor_bytes([snapshot.model, snapshot.optimizer, snapshot.trainer, snapshot.rng])


def save_checkpoint(root: Path, snapshot: Snapshot, keep: int, is_main: bool,
                    sharded_state=None, copy_to: Path | None = None) -> Path:
    """All ranks call it. Rank 0 writes (the others wait), except FSDP shards, which every
    rank writes into the same temporary folder first (each through a descriptor of its
    own: _save_shards). `copy_to`: the run folder's
    checkpoints, when `root` is the local tier's. The checkpoint's path in the run folder."""
    step = snapshot.trainer["step"]
    tmp = make_save_folder(root, snapshot, sharded_state is not None) if is_main else None
    try:
        shard_files = _save_shards(root, tmp, snapshot, sharded_state)
        if is_main:
            end_save(write_checkpoint(root, tmp, snapshot, shard_files), keep, copy_to)
    finally:
        if tmp is not None:
            let_go(tmp)
    distributed.barrier()  # the others wait until the checkpoint is complete
    return (copy_to or root) / step_name(step)


def make_save_folder(root: Path, snapshot: Snapshot, sharded: bool) -> Path:
    """Rank 0: the save's empty temporary folder (one a killed run left is moved aside)."""
    tmp = root / f".tmp-{step_name(snapshot.trainer['step'])}"
    root.mkdir(parents=True, exist_ok=True)
    if tmp.exists() or tmp.is_symlink():  # left by a run killed while saving this step
        move_aside(tmp, "incomplete")
    with guarded_save(root, tmp, lambda: snapshot_bytes(snapshot)):
        # Private while written (see folder.publish) and reached from here on only through
        # its descriptor: the checkpoints folder may be written by others, who could rename
        # it and put a link to any folder of the user's at its name.
        held = make_held(tmp)  # the caller lets go of it once the save is done
        if sharded:
            (held / SHARDS_DIR).mkdir()
    return held


def write_checkpoint(root: Path, tmp: Path, snapshot: Snapshot,
                     shard_files: dict | None = None) -> Path:
    """Rank 0, itself: the files, the manifest, the commit (store.finish_checkpoint); a
    full disk in one line. Copying and pruning are the caller's (store.end_save)."""
    final = root / step_name(snapshot.trainer["step"])
    with guarded_save(root, tmp, lambda: snapshot_bytes(snapshot)):
        finish_checkpoint(tmp, final, as_bytes(checkpoint_files(snapshot)), header(snapshot),
                          shard_files)
    return final


def _save_shards(root: Path, tmp: Path | None, snapshot: Snapshot, sharded_state) -> dict:
    """FSDP: every rank writes its shard into rank 0's folder `tmp` (None on the others);
    rank 0 gets the manifest entries of all of them. The second gather is the barrier: no
    rank contributes before its shard is on disk, so rank 0 names and renames only
    complete files, and never reads one back to hash it. A rank that cannot hold rank 0's
    folder says so in that gather, and every rank stops with its line (none waits)."""
    if sharded_state is None:
        return {}
    world_size = snapshot.trainer["world_size"]
    # Rank 0's folder by its inode (the gather: it exists before anyone writes into it).
    # The others hold it themselves, found by that inode, never by its name, which a
    # neighbour may have swapped for a link to a folder of the user's or one of theirs.
    inode = distributed.gather_objects({"inode": tmp and os.stat(tmp).st_ino},
                                       world_size)[0]["inode"]
    answers = distributed.gather_objects(_own_shard(root, tmp, inode, snapshot, sharded_state),
                                         world_size)
    if why := next((answer["refused"] for answer in answers if answer["refused"]), ""):
        if tmp is not None:
            remove_held(tmp, root)
        raise OSError(errno.EPERM, why)
    return {f"{SHARDS_DIR}/{name}": entry for answer in answers
            for name, entry in answer["files"].items()}


def _own_shard(root: Path, tmp: Path | None, inode: int, snapshot: Snapshot,
               sharded_state) -> dict:
    """This rank's shard written into rank 0's folder (`tmp` on rank 0, else held by its
    `inode`): {"files": its manifest entries, "refused": ""}, or "refused": why that folder
    could not be held, said in the gather rather than raised, so that no rank waits."""
    try:
        folder = tmp if tmp is not None else hold_by_inode(root, inode)
    except OSError as error:
        return {"files": {}, "refused": named_for_the_user(error.strerror or str(error))}
    try:
        with guarded_save(root, folder, lambda: snapshot_bytes(snapshot)):
            files = save_shards(sharded_state.model, sharded_state.optimizer,
                                folder / SHARDS_DIR, snapshot.trainer["world_size"])
    finally:
        if tmp is None:
            let_go(folder)
    return {"files": files, "refused": ""}
