"""`train`'s resume: which checkpoint a run continues from.

`prepare` runs before training (--resume never / --overwrite), `resume` loads the newest
complete, verified checkpoint of the run's timeline through the one resume both doors
share (workload.checkpoint.session's `resume_newest`: all ranks agree on its step first;
a bad one is moved aside and the one before is tried). Which steps are on the timeline, a
rollback and what `--overwrite` removes are the folder's
(workload.checkpoint.writer.folder); this module decides whether a checkpoint fits this
run, by train's settings.
"""

from __future__ import annotations

import os
from pathlib import Path

from workload.checkpoint.content import check_fits
from workload.checkpoint.writer.folder import roll_back, written_by_train
from workload.checkpoint.local import bind_to_run, local_root, promote_newer, remove_local
from workload.checkpoint.session import resume_newest
from workload.checkpoint.snapshot import CLASSES, read_checkpoint, restore, run_settings
from workload.checkpoint.writer.store import (CorruptCheckpoint, OldFormat, Snapshot)
from workload.config import MAY_CHANGE_ON_RESUME, flag_of, out_of_range
from workload.errors import UsageError
from workload.files import json_text, path_kind, read_jsonl_records, replace_file
from workload.held import remove_in
from workload.logs import logger
from workload.runfolder import RunFolder


def prepare(cfg, folder: RunFolder | Path, is_main: bool) -> None:
    """--resume never: refuse an output directory holding checkpoints, unless --overwrite,
    which removes what `train` wrote there and nothing else. A `checkpoints` that is a
    symbolic link is refused: it is never followed (a run prunes and replaces folders
    there), and nothing it points at is moved or lost. Then the local tier, if any, is
    bound to this run folder (workload.checkpoint.local.bind_to_run)."""
    folder = RunFolder.of(folder)
    root = folder.checkpoints
    if root.is_symlink():
        raise UsageError(f"{root} is a symbolic link (to {root.resolve()}); checkpoints are "
                         "pruned and replaced inside the run folder, so they must live "
                         "there: pass --output-dir on the file system you want instead, or "
                         "replace the link with a folder")
    for record in folder.records:  # appended to or replaced: a link is refused
        if (problem := _not_a_record(record)) is not None:
            raise UsageError(f"{record} is {problem}, not a file train wrote; train "
                             "never writes through one: remove it (or move it away) and "
                             "start again")
    own = written_by_train(root)
    if cfg.checkpoint.resume == "never" and own:
        _overwrite(cfg, folder, own, is_main)
    if is_main and cfg.checkpoint.checkpoint_local:
        bind_to_run(cfg.checkpoint.checkpoint_local, folder)


def _not_a_record(path: Path) -> str | None:
    """What is at `path` in words when it is neither missing nor a regular file."""
    if not os.path.lexists(path) or (path.is_file() and not path.is_symlink()):
        return None
    return "a symbolic link" if path.is_symlink() else path_kind(path)


def _overwrite(cfg, folder: RunFolder, own: list[Path], is_main: bool) -> None:
    out = folder.root
    root = folder.checkpoints
    if not cfg.checkpoint.overwrite:
        raise UsageError(f"--output-dir {out} already holds checkpoints ({root}) and --resume "
                         "never would start another run over them; pass --resume auto to "
                         "continue that run, a new --output-dir, or --overwrite to delete "
                         "its step-* folders, `latest`, metrics.jsonl, steps.jsonl and "
                         "summary.json (other files there are left alone)")
    if is_main:
        logger.warning(f"--overwrite: removing the previous run's {len(own)} checkpoint "
                       f"entries in {root} and its records; other files there are kept")
        # By name in the folders the run holds: never through a link put at a name since
        remove_in(root, [path.name for path in own])
        for record in folder.records:  # they would mix two runs
            record.unlink(missing_ok=True)
        remove_local(cfg.checkpoint.checkpoint_local, out)


def resume(cfg, info, state, folder: RunFolder | Path, num_classes: int) -> None:
    """Load the checkpoint this run continues from, if there is one."""
    if cfg.checkpoint.resume == "never":
        return
    folder = RunFolder.of(folder)
    out = folder.root
    current = run_settings(cfg, num_classes)
    if cfg.checkpoint.resume != "auto":
        path = Path(cfg.checkpoint.resume)
        restore(_read_explicit(path, current, state), state, info.rank, info.world_size)
    else:
        root = folder.checkpoints
        local = cfg.checkpoint.checkpoint_local
        if local and info.is_main:  # the others wait in resume_newest's collective
            promote_newer(local_root(local, out), root, cfg.checkpoint.keep_checkpoints)
        found = resume_newest(root, info, state, lambda p: _read_auto(p, current, state),
                              lambda snapshot, p, chosen_here: _accept_auto(
                                  snapshot, current, state, p, chosen_here),
                              read=read_checkpoint)
        if found is None:
            logger.info(f"no checkpoint in {root}: starting from step 0")
            return
        path = found[0]
    if info.is_main:
        if cfg.checkpoint.resume != "auto":  # --resume PATH: maybe a step of this folder
            roll_back(folder.checkpoints, path, state.step)
            _forget_local(cfg.checkpoint.checkpoint_local, out, path)
        trim_metrics(folder.metrics, _epochs_recorded(cfg, state))
    logger.info(f"resumed from {path}: step {state.step}, epoch {state.epoch + 1}, "
                f"batch {state.batch} of the epoch")


def _forget_local(local: str, out: Path, path: Path) -> None:
    """--resume PATH chose where the run goes on: the local tier's copies, which may be
    later steps, would undo that choice at the next resume if the job ended before its
    first save. The run folder keeps every checkpoint."""
    if local and remove_local(local, out):
        logger.info(f"--checkpoint-local: the local copies of this run removed: --resume "
                    f"{path} chose where it continues (the run folder keeps its checkpoints)")


def _epochs_recorded(cfg, state) -> int:
    """The epochs whose metrics.jsonl lines stay: those the checkpoint finished, and the
    unfinished one the step limit stopped when this run trains no further (it already
    stands at its --max-steps, so that line would not be written again)."""
    limit = cfg.training.max_steps
    return state.epoch + bool(state.batch and limit and state.step >= limit)


def _read_explicit(path: Path, current: dict, state) -> Snapshot:
    """--resume PATH: a checkpoint that loads and fits this model, else one line (exit 2);
    other settings only warn."""
    listed = ""
    try:
        snapshot = read_checkpoint(path)
        listed = differences(snapshot.config, current)
        check_fits(snapshot, state, path)
    except OldFormat as error:
        raise UsageError(f"--resume {error}") from None
    except CorruptCheckpoint as error:
        settings = f" (it was written with other settings: {listed})" if listed else ""
        raise UsageError(f"--resume {path}: {error}{settings}; pass a checkpoint of this "
                         "model, or --resume auto to take the newest good one") from None
    check_same_run(snapshot.config, current, path, strict=False)
    return snapshot


def _read_auto(path: Path, current: dict, state) -> Snapshot:
    """--resume auto: a checkpoint that loads; a checkpoint of another run is refused
    later, with its settings; one of this run that does not fit the model is corrupt."""
    snapshot = read_checkpoint(path)
    if not differences(snapshot.config, current):
        check_fits(snapshot, state, path)
    return snapshot


def _accept_auto(snapshot: Snapshot, current: dict, state, path: Path,
                 chosen_here: bool) -> None:
    """--resume auto: the checkpoint chosen is this run's; whether it fits the model was
    checked as rank 0 chose it (`_read_auto`), and is checked here on the other ranks."""
    check_same_run(snapshot.config, current, path, strict=True)
    if not chosen_here:
        check_fits(snapshot, state, path)


def differences(saved: dict, current: dict) -> str:
    """The settings a checkpoint's run had otherwise ("" when none)."""
    differ = [k for k in saved.keys() & current.keys()
              if k not in MAY_CHANGE_ON_RESUME and saved[k] != current[k]]
    return ", ".join(_difference(k, saved[k], current[k]) for k in sorted(differ))


def _difference(key: str, there, now) -> str:
    if key == CLASSES:  # not a flag: what the run's data held
        return f"its data had {there} classes, this run's data has {now}"
    return f"{flag_of(key)} {there!r} there, {now!r} now"


def check_same_run(saved: dict, current: dict, path: Path, strict: bool) -> None:
    """Whether a checkpoint fits this run, from the settings it recorded: refuse (auto) or
    warn about (an explicit path) one of another run. Nothing is moved aside: its files
    are good, they belong to another run."""
    listed = differences(saved, current)
    if not listed:
        return
    if not strict:
        logger.warning(f"{path} was written with other settings ({listed}); loading it anyway")
        return
    raise UsageError(f"{path} belongs to another run ({listed}); resume it with its own "
                     "settings and data, start this run in another --output-dir, or replace "
                     "that run with --resume never --overwrite (nothing was moved or deleted)")


def trim_metrics(path: Path, epochs_done: int) -> None:
    """Drop the records of epochs after the checkpoint (they will be run again), and lines
    that are torn or not records, with a warning."""
    if not path.is_file():
        return
    records, dropped = read_jsonl_records(path)
    for why in dropped:
        logger.warning(f"{path}: {why}; dropping it")
    epochs = [r for r in records if not out_of_range("epoch", r.get("epoch"))]
    if len(epochs) < len(records):
        first = next(r for r in records if out_of_range("epoch", r.get("epoch")))
        logger.warning(f"{path}: dropping {len(records) - len(epochs)} lines without an "
                       f"epoch train writes ({out_of_range('epoch', first.get('epoch'))})")
    kept = [r for r in epochs if r["epoch"] <= epochs_done]
    later = len(epochs) - len(kept)
    if later:  # a rewrite says what it removes
        logger.info(f"{path}: dropping the lines of {later} epochs after epoch {epochs_done}, "
                    "where the checkpoint stands (this run writes them again)")
    if dropped or len(kept) != len(records):
        replace_file(path, "".join(json_text(r) + "\n" for r in kept).encode())
