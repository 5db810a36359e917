"""The run's checkpoints folder and its timeline: which steps it holds, which of them a
run may continue from, and every change to it (a save taking its place, `latest`,
pruning, moving a bad one aside, a rollback, what `--overwrite` removes).

Layout of `<output-dir>/checkpoints/` (what one step folder holds:
workload.checkpoint.writer.store):
    step-000000120/         one complete checkpoint (the name is the optimizer step)
    latest                  the name of the newest complete checkpoint (replaced atomically)
    step-000000100.corrupt-20261122-161500/     a bad one, moved aside
    step-000000140.abandoned-20261122-163000/   a step after a rollback, kept for the user
    .tmp-step-000000160/    a save under way (or one a crash interrupted)

The commit point of every save (in the trainer or the writer process, in the run folder
or the local tier; docs/checkpoints.md says it for users) is the atomic replacement of
`latest` by a file that names it (`publish`): its files, the manifest last, are written in
`.tmp-step-N` and fsynced with the folder (all at once: durable.Syncs) before the folder is
renamed into place, `latest` follows, one fsync of checkpoints/ makes both renames durable,
and the oldest are pruned only after it, so that a crash at any instant leaves the
timeline whole (what each instant leaves: `publish`).

`latest` names the checkpoint the last save wrote: the head of the run's current timeline.
Steps after it are not on it (a rollback left them, or a crash came between a save's
rename and the update of `latest`), so `--resume auto` never continues from them. A
rollback renames the later steps `step-...abandoned-<time>`: kept whole for the user (never
resumed, never pruned), out of the way of the steps the new timeline saves.
"""

from __future__ import annotations

import os
import re
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from workload.checkpoint.writer.durable import CorruptCheckpoint, fsync_dir
from workload.files import open_to_group, replace_file
from workload.held import holding, rename_held
from workload.logs import logger
from workload.runfolder import RunFolder

_STEP_DIR = re.compile(r"^step-(\d+)$")
# A folder moved aside: step-000000100.corrupt-20261122-161500 (or ~1, ~2 after it).
_ASIDE_DIR = re.compile(r"^(step-\d+)\.(corrupt|incomplete)-(\d{8}-\d{6})(~\d+)?$")
# Moved-aside folders kept of each kind; older ones are deleted after each save, so that a
# run that keeps failing cannot fill the disk with them.
KEEP_ASIDE = 3
# Everything `train` writes in checkpoints/: step folders, the ones moved aside, the
# temporary folders of a save, `latest` and its temporary file. Nothing else is its own.
_TRAIN_WRITES = re.compile(
    r"^(step-\d+(\.(corrupt|incomplete|abandoned)-\d{8}-\d{6}(~\d+)?)?"
    r"|\.tmp-step-\d+|\.replaced-step-\d+-\d+|latest|\.latest\.tmp-\w+)$")
Loaded = TypeVar("Loaded")


def checkpoints_dir(out: Path) -> Path:
    return RunFolder(Path(out)).checkpoints


def step_name(step: int) -> str:
    return f"step-{step:09d}"


# --- what the folder holds --------------------------------------------------------------

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


def written_by_train(root: Path) -> list[Path]:
    """What `train` wrote in checkpoints/ (a symbolic link is never its own)."""
    if not root.is_dir() or root.is_symlink():
        return []
    return sorted(p for p in root.iterdir()
                  if _TRAIN_WRITES.match(p.name) and not p.is_symlink())


# --- the timeline -----------------------------------------------------------------------

def latest_step(root: Path) -> int | None:
    """The step `latest` names, or None when it is missing or names no step (a run of an
    earlier version: every step then counts)."""
    try:
        match = re.fullmatch(r"step-(\d+)", (root / "latest").read_text().strip())
    except (OSError, UnicodeDecodeError):
        return None
    return int(match.group(1)) if match else None


def on_timeline(root: Path) -> list[tuple[int, Path]]:
    """The complete steps `--resume auto` may continue from, oldest first: those up to
    `latest`. Later ones are left where they are, with a line saying why."""
    steps = complete_steps(root)
    head = latest_step(root)
    if head is None:
        return steps
    for step, path in steps:
        if step > head:
            logger.warning(f"not resuming {path}: it comes after {root / 'latest'} "
                           f"(step {head}), so it is not on the run's current timeline "
                           "(a rollback or an interrupted save left it); it is kept")
    return [(step, path) for step, path in steps if step <= head]


def newest_loadable(root: Path, load: Callable[[Path], Loaded]) -> Loaded | None:
    """What `load(path)` makes of the newest checkpoint of the run's timeline (up to
    `latest`) that it takes, or None; one it refuses (CorruptCheckpoint) and unfinished
    saves are moved aside."""
    if root.is_symlink():
        logger.warning(f"{root} is a symbolic link: not followed, starting from step 0")
        return None
    for leftover in sorted(root.glob(".tmp-step-*")) if root.is_dir() else []:
        moved = move_aside(leftover, "incomplete")
        logger.warning(f"skipping a checkpoint whose save did not finish: moved to {moved}")
    for link in symlinked_steps(root):
        logger.warning(f"skipping {link}: a symbolic link (to {link.resolve()}), not a "
                       "checkpoint of this run; it is never loaded, pruned or followed")
    for _step, path in reversed(on_timeline(root)):
        try:
            return load(path)
        except CorruptCheckpoint as error:
            moved = move_aside(path, "corrupt")
            logger.warning(f"skipping a bad checkpoint: {error}; moved to {moved}, "
                           "resuming from the one before")
    return None


def roll_back(root: Path, path: Path, step: int) -> None:
    """`--resume PATH` to a step of this run's own folder: it becomes the head of the
    timeline; the steps after it are renamed `.abandoned-<time>` and kept."""
    if path.resolve().parent != root.resolve() or path.name != step_name(step):
        return  # another folder's checkpoint (or one moved aside): the timeline stays
    later = [p for s, p in complete_steps(root) if s > step]
    for old in later:
        moved = move_aside(old, "abandoned")
        logger.warning(f"rolled back to {path.name}: {old.name}, after it, moved to "
                       f"{moved.name} (kept, never resumed; delete it when done with it)")
    if later or latest_step(root) != step:
        replace_latest(root, path.name)


# --- changing it ------------------------------------------------------------------------

def publish(tmp: Path, final: Path) -> None:
    """A finished save's folder takes its place: renamed into place, then `latest`
    replaced, the commit point (this module's docstring). Pruning is the caller's, after
    it (store.end_save: the writer process prunes only once it has told the loop
    the checkpoint is committed)."""
    root = final.parent
    # A save's folder is private (0700) while it is written: in a run folder others may
    # write, no one can put a link in it for a writer to follow (safetensors' own writer
    # follows links), and `tmp` is its held path (workload.held.make_held): renamed by its own
    # name, never a folder someone put at that name. Complete, it gets the mode mkdir
    # would have given it.
    open_to_group(tmp)
    # checkpoints/ itself held while the save takes its place and `latest` is replaced:
    # swapped for a link to another run's folder of the user's meanwhile, neither the
    # rename nor `latest` lands there.
    with holding(root) as held:
        _rename_into_place(tmp, held / final.name)
        _write_latest(held, final.name)
        # One fsync of checkpoints/ makes both renames durable, where a sync after each
        # cost a round trip to a parallel file system's metadata server more. What a crash
        # before it may leave, each a whole timeline (on_timeline, newest_loadable):
        # neither rename (`.tmp-step-N`, moved aside as unfinished; the step before
        # resumed), the folder's alone (step-N after `latest`: not resumed, kept, as a
        # crash between the two always could), or `latest`'s alone, where a file system
        # keeps no order between renames (`latest` names a step whose folder is still
        # `.tmp-step-N`: moved aside, and the step before it, on the timeline and not yet
        # pruned, resumed). Pruning comes only after this sync (the caller's).
        fsync_dir(held)


def replace_latest(root: Path, name: str) -> None:
    """`latest` names `name`, durably (a rollback's)."""
    _write_latest(root, name)
    fsync_dir(root)


def _write_latest(root: Path, name: str) -> None:
    """`latest` replaced by a file that names `name`, its content fsynced before the
    rename (a name without its bytes would read as an empty `latest`); the rename is made
    durable by the caller's fsync of `root`."""
    replace_file(root / "latest", name.encode() + b"\n", durable=True)


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


def _rename_into_place(tmp: Path, final: Path) -> None:
    """os.replace cannot replace a non-empty folder: an older save of the same step that
    `latest` names (the last save, such as a preemption's before the epoch end's) is
    renamed away first, then removed. One `latest` does not name was left off the
    timeline (a crash between its rename and `latest`) and is kept, as a resume promised:
    moved aside as abandoned, with a line."""
    if ((final.exists() or final.is_symlink())
            and latest_step(final.parent) != int(final.name.removeprefix("step-"))):
        moved = move_aside(final, "abandoned")
        logger.warning(f"saving {final.name}: the folder of that name, not on the run's "
                       f"timeline, moved to {moved.name} (kept, never resumed)")
    if final.exists() or final.is_symlink():
        old = final.with_name(f".replaced-{final.name}-{os.getpid()}")
        os.replace(final, old)
        rename_held(tmp, final)
        remove_tree(old)
    else:
        rename_held(tmp, final)


def prune(root: Path, keep: int, newest: int) -> None:
    """Remove complete checkpoints older than the newest `keep` up to step `newest`."""
    with holding(root) as held:  # never the folder of another run swapped in meanwhile
        older = [path for step, path in complete_steps(held) if step <= newest]
        for path in older[:-keep]:
            remove_tree(path)
        prune_aside(held)


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
