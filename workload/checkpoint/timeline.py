"""The run's timeline in `checkpoints/`: which steps `--resume auto` may continue from, a
rollback (`--resume PATH` to an earlier step of the same folder), and what `--overwrite`
removes.

`latest` names the checkpoint the last save wrote: the head of the run's current timeline.
Steps after it are not on it (a rollback left them, or a crash came between a save's
rename and the update of `latest`), so `--resume auto` never continues from them. A
rollback renames the later steps `step-...abandoned-<time>`: kept whole for the user (never
resumed, never pruned), out of the way of the steps the new timeline saves.
"""

from __future__ import annotations

import re
from pathlib import Path

from workload.checkpoint.store import complete_steps, move_aside, replace_latest, step_name
from workload.logs import logger

# Everything `train` writes in checkpoints/: step folders, the ones moved aside, the
# temporary folders of a save, `latest` and its temporary file. Nothing else is its own.
_TRAIN_WRITES = re.compile(
    r"^(step-\d+(\.(corrupt|incomplete|abandoned)-\d{8}-\d{6}(~\d+)?)?"
    r"|\.tmp-step-\d+|\.replaced-step-\d+-\d+|latest|\.latest\.tmp-\d+)$")


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
    steps, head = complete_steps(root), latest_step(root)
    if head is None:
        return steps
    for step, path in steps:
        if step > head:
            logger.warning(f"not resuming {path}: it comes after {root / 'latest'} "
                           f"(step {head}), so it is not on the run's current timeline "
                           "(a rollback or an interrupted save left it); it is kept")
    return [(step, path) for step, path in steps if step <= head]


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


def written_by_train(root: Path) -> list[Path]:
    """What `train` wrote in checkpoints/ (a symbolic link is never its own)."""
    if not root.is_dir() or root.is_symlink():
        return []
    return sorted(p for p in root.iterdir()
                  if _TRAIN_WRITES.match(p.name) and not p.is_symlink())
