"""The checks of what a user's loop passes to Checkpoints (workload.checkpoint.loop): each
bad argument a UsageError of one line naming the value, what was expected and the fix,
raised before anything is written. What a save accepts is what a resume reads back: the
step and `extra` are held to the reader's own limits (the counts of
workload.checkpoint.content, the JSON of workload.checkpoint.writer.durable), so no save writes
a checkpoint that no resume can load. Importing this module imports no torch; the checks
of a step and of `extra` do.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from workload.errors import UsageError
from workload.files import unwritable_reason
from workload.logs import shown

JSON_VALUES = ("JSON values (dicts with string keys, lists, strings, finite numbers, "
               "booleans, None)")
# Where a rank's `extra` lies in trainer.json: {"format", "data": {"extras": [extra]}}.
EXTRA_DEPTH = 3
# The parts a loop passes, and the methods each must have (a save and a resume call them).
METHODS = ("state_dict", "load_state_dict")


def folder_path(folder) -> Path:
    if not isinstance(folder, (str, os.PathLike)) or not str(folder):
        raise UsageError(f"Checkpoints: folder {shown(folder)} is not a path; pass the "
                         "folder of this run, e.g. Checkpoints('runs/mine')")
    text = os.fsdecode(os.fspath(folder))
    if any(ord(character) < 32 or ord(character) == 127 for character in text):
        raise UsageError(f"Checkpoints: folder {shown(text, 300)} has a control character (a "
                         "newline, a tab, ...) in its name, which every line naming the "
                         "folder would break; pass a folder name without one, e.g. "
                         "Checkpoints('runs/mine')")
    return Path(folder)


def make_folder(folder: Path) -> None:
    reason = unwritable_reason(folder, create=True)
    if reason:
        raise UsageError(f"Checkpoints: {reason}; pass a folder you can write (it is "
                         "created when missing), e.g. Checkpoints('runs/mine')")


def switch(value) -> bool:
    if not isinstance(value, bool):
        raise UsageError(f"Checkpoints: async_save={shown(value)} is not True or False; "
                         "pass async_save=False for saves that return once on disk")
    return value


def whole(value) -> int | None:
    """`value` as an int when it is a whole number (numpy's and torch's integers
    included: they are what a loop's counters often are), else None."""
    if isinstance(value, bool) or not hasattr(type(value), "__index__"):
        return None
    try:
        return int(value.__index__())
    except (TypeError, ValueError, RuntimeError):  # a torch tensor of several numbers
        return None


def keep_count(keep) -> int:
    count = whole(keep)
    if count is None or count < 1:
        raise UsageError(f"Checkpoints: keep={shown(keep)} is not a whole number of 1 or "
                         "more; pass how many of the newest checkpoints to keep, e.g. keep=3")
    return count


def step_count(step) -> int:
    """The step a save records, as an int: a whole number a checkpoint holds."""
    from workload.config import MAX_COUNT

    count = whole(step)
    if count is None or not 0 <= count <= MAX_COUNT:
        beyond = (" (a checkpoint holds steps up to 2^62)"
                  if count is not None and count > MAX_COUNT else "")
        raise UsageError(f"Checkpoints.save: step {shown(step)} is not a whole number of 0 "
                         f"or more{beyond}; pass the optimizer steps done so far (step + 1 "
                         "after the step with index `step`), the number resume() returns")
    return count


def check_parts(call: str, model, optimizer, scheduler, scaler) -> None:
    """The objects a save or resume takes: a torch module, and parts with a state."""
    from torch import nn

    if not isinstance(model, nn.Module):
        raise UsageError(f"Checkpoints.{call}: model={shown(model)} is not a torch.nn.Module;"
                         " pass the model you train (DDP- or FSDP-wrapped or not)")
    if not isinstance(getattr(optimizer, "param_groups", None), list):
        raise UsageError(f"Checkpoints.{call}: optimizer={shown(optimizer)} is not a torch "
                         "optimizer (it has no param_groups); pass the optimizer that "
                         "steps the model, e.g. torch.optim.AdamW(model.parameters())")
    for name, part in (("optimizer", optimizer), ("scheduler", scheduler),
                       ("scaler", scaler)):
        if part is not None and not all(callable(getattr(part, m, None)) for m in METHODS):
            raise UsageError(f"Checkpoints.{call}: {name}={shown(part)} has no state_dict() "
                             f"and load_state_dict(); pass a torch {name}, or None when "
                             "the loop has none")


def json_extra(extra) -> dict:
    """`extra` as a resume gives it back (`ckpt.extra`): parsed by the reader's strict JSON
    and within the nesting it reads, or a UsageError of one line."""
    from workload.checkpoint.formats import too_deep_to_read
    from workload.files import strict_json

    if extra is None:
        return {}
    if not isinstance(extra, dict):
        raise UsageError(f"Checkpoints.save: extra={shown(extra)} is not a dict; pass a "
                         f"dict of {JSON_VALUES}, e.g. extra={{'epoch': epoch, 'batch': i}}")
    try:
        value = strict_json(json.dumps(extra, allow_nan=False))
    except (TypeError, ValueError, RecursionError) as error:
        raise UsageError(f"Checkpoints.save: extra={shown(extra)} is not JSON-able "
                         f"({str(error)[:200]}); pass only {JSON_VALUES}, e.g. "
                         "the epoch and the batch within it") from None
    if changed := json_change(extra, "extra"):
        raise UsageError(f"Checkpoints.save: {changed}, so a resume would not give `extra` "
                         "back as saved; pass only JSON's own kinds (string keys, lists, not "
                         "tuples), e.g. extra={'epoch': epoch, 'batch': i}")
    if too_deep_to_read(value, EXTRA_DEPTH):
        raise UsageError(f"Checkpoints.save: extra={shown(extra)} is nested too deeply for "
                         "a checkpoint to read back; keep it a few levels deep (the epoch, "
                         "the batch within it, a few counters)")
    return value


def json_change(value, where: str) -> str:
    """What JSON would give back otherwise than `value` holds it ("" when nothing): a
    key that is not a string (1 comes back "1"), a tuple (it comes back a list)."""
    if isinstance(value, tuple):
        return f"{where} is a tuple, which JSON gives back as a list"
    if isinstance(value, dict):
        for key, inner in value.items():
            if not isinstance(key, str):
                back = next(iter(json.loads(json.dumps({key: 0}))))
                return (f"{where} has the key {shown(key, 40)} ({type(key).__name__}), "
                        f"which JSON gives back as the string {shown(back, 40)}")
            if changed := json_change(inner, f"{where}[{key!r}]"):
                return changed
    if isinstance(value, list):
        return next((changed for index, inner in enumerate(value)
                     if (changed := json_change(inner, f"{where}[{index}]"))), "")
    return ""


# --- `extra` in the trainer state: each rank's ---------------------------------------------

def every_rank_extra(extra: dict, world_size: int) -> dict:
    """What the trainer state holds of the ranks' `extra` (a collective: every rank calls
    it): rank 0's as `extra`, and every rank's as `extras` where they differ (a rank's own
    position in its data), so that each rank gets its own back."""
    from workload.distributed import gather_objects

    if world_size == 1:
        return {"extra": extra}
    extras = [each["extra"] for each in gather_objects({"extra": extra}, world_size)]
    if all(each == extras[0] for each in extras):
        return {"extra": extras[0]}
    return {"extra": extras[0], "extras": extras}


def rank_extra(trainer: dict, rank: int) -> dict:
    """The `extra` this rank saved; rank 0's for a rank the checkpoint has none of (it was
    saved by fewer ranks) or when every rank saved the same."""
    extras = trainer.get("extras", [])
    return extras[rank] if rank < len(extras) else trainer.get("extra", {})


def extra_problem(trainer: dict) -> str | None:
    """What is wrong with a checkpoint's `extra` and `extras` (None: nothing)."""
    if not isinstance(trainer.get("extra", {}), dict):
        return "`extra` is not a dictionary"
    extras = trainer.get("extras", [])
    if not (isinstance(extras, list) and all(isinstance(each, dict) for each in extras)):
        return "`extras` is not a list of dictionaries"
    return None
