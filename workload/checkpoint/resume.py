"""Resume: which checkpoint a run continues from.

`prepare` runs before training (--resume never / --overwrite), `resume` loads the newest
complete, verified checkpoint (all ranks agree on its step first); a bad one is moved
aside and the one before is tried.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from workload import distributed
from workload.checkpoint.snapshot import read_checkpoint, restore
from workload.checkpoint.store import (CorruptCheckpoint, Snapshot, checkpoints_dir,
                                       complete_steps, move_aside, step_name)
from workload.errors import UsageError
from workload.logs import logger

# Settings a resumed run may change: where things are, how long to train, how to checkpoint.
# Any other difference from the checkpoint's config means another run's checkpoints.
MAY_CHANGE_ON_RESUME = {
    "epochs", "max_steps", "target_accuracy", "patience", "output_dir", "data_dir",
    "download", "workers", "compile", "device", "recipe", "resume", "overwrite",
    "checkpoint_every", "keep_checkpoints", "preempt_signal", "dist_timeout_s",
}
# Also where the data is staged, how progress is shown and tracked, and the starting weights
# (a resumed run takes its weights from the checkpoint).
MAY_CHANGE_ON_RESUME |= {"stage_to", "prepare_data", "log_every", "wandb", "init_from",
                         "init_reinit_head"}


def prepare(cfg, out: Path, is_main: bool) -> None:
    """--resume never: refuse an output directory holding checkpoints, unless --overwrite."""
    root = checkpoints_dir(out)
    if cfg.checkpoint.resume != "never" or not (root.is_dir() and any(root.iterdir())):
        return
    if not cfg.checkpoint.overwrite:
        raise UsageError(f"--output-dir {out} already holds checkpoints ({root}) and --resume "
                         "never would start another run over them; pass --resume auto to "
                         "continue that run, a new --output-dir, or --overwrite to replace it")
    if is_main:
        logger.warning(f"--overwrite: removing {root} and the previous run's records")
        shutil.rmtree(root)
        for name in ("metrics.jsonl", "summary.json"):
            (out / name).unlink(missing_ok=True)


def resume(cfg, info, state, out: Path) -> None:
    """Load the checkpoint this run continues from, if there is one."""
    if cfg.checkpoint.resume == "never":
        return
    explicit = cfg.checkpoint.resume != "auto"
    snapshot, path = None, Path(cfg.checkpoint.resume) if explicit else None
    if not explicit:
        if info.is_main:
            snapshot = newest_loadable(checkpoints_dir(out), info.device)
        step = _agree_on_step(snapshot.trainer["step"] if snapshot else -1, info)
        if step < 0:
            logger.info(f"no checkpoint in {checkpoints_dir(out)}: starting from step 0")
            return
        path = checkpoints_dir(out) / step_name(step)
    if snapshot is None:
        snapshot = _read(path, explicit, info.device)
    check_same_run(snapshot.config, cfg.to_dict(), path, strict=not explicit)
    restore(snapshot, state, info.rank, info.world_size, path)
    if info.is_main:
        trim_metrics(out / "metrics.jsonl", state.epoch)
    logger.info(f"resumed from {path}: step {state.step}, epoch {state.epoch + 1}, "
                f"batch {state.batch} of the epoch")


def _read(path: Path, explicit: bool, device) -> Snapshot:
    try:
        return read_checkpoint(path, device)
    except CorruptCheckpoint as error:
        if explicit:
            raise UsageError(f"--resume {path}: {error}; pass another checkpoint, or "
                             "--resume auto to take the newest good one") from None
        raise


def newest_loadable(root: Path, device) -> Snapshot | None:
    """The newest checkpoint that verifies and loads; bad and unfinished ones moved aside."""
    for leftover in sorted(root.glob(".tmp-step-*")) if root.is_dir() else []:
        moved = move_aside(leftover, "incomplete")
        logger.warning(f"skipping a checkpoint whose save did not finish: moved to {moved}")
    for step, path in reversed(complete_steps(root)):
        try:
            return read_checkpoint(path, device)
        except CorruptCheckpoint as error:
            moved = move_aside(path, "corrupt")
            logger.warning(f"skipping a bad checkpoint: {error}; moved to {moved}, "
                           "resuming from the one before")
    return None


def _agree_on_step(step: int, info) -> int:
    """Rank 0's choice, shared with every rank (they all load the same step)."""
    value = torch.tensor([step + 1 if info.is_main else 0], dtype=torch.int64,
                         device=info.device)
    return int(distributed.all_reduce_sum(value).item()) - 1


def check_same_run(saved: dict, current: dict, path: Path, strict: bool) -> None:
    """Refuse (auto) or warn about (an explicit path) a checkpoint of a different run."""
    differ = [k for k in saved.keys() & current.keys()
              if k not in MAY_CHANGE_ON_RESUME and saved[k] != current[k]]
    if not differ:
        return
    listed = ", ".join(f"--{k.replace('_', '-')} {saved[k]!r} there, {current[k]!r} now"
                       for k in sorted(differ))
    if not strict:
        logger.warning(f"{path} was written with other settings ({listed}); loading it anyway")
        return
    raise UsageError(f"{path} belongs to a run with other settings ({listed}); pass the same "
                     "flags to resume it, a new --output-dir, or --resume never --overwrite "
                     "to replace it")


def trim_metrics(path: Path, epochs_done: int) -> None:
    """Drop the records of epochs after the checkpoint: they will be run again."""
    if not path.is_file():
        return
    lines = path.read_text().splitlines(keepends=True)
    kept = [line for line in lines if line.strip() and json.loads(line)["epoch"] <= epochs_done]
    if len(kept) != len(lines):
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text("".join(kept))
        tmp.replace(path)
