"""Checkpoints for your own training loop: `train`'s files, checks and guarantees behind
four calls (docs/your-script.md).

    ckpt = Checkpoints("runs/mine", keep=3)        # rank 0 takes the folder's lock
    start = ckpt.resume(model=model, optimizer=opt, scheduler=sched)     # step, or 0
    ckpt.save(step, model=model, optimizer=opt, scheduler=sched, extra={"epoch": epoch})
    ckpt.close()

Nothing here writes or reads a file itself. A save is train's collective save
(workload.checkpoint.saving: rank 0 writes under DDP, every rank its shard under FSDP2,
the random states of every rank, a full disk in one line); a resume is train's
(workload.checkpoint.resuming and folder: the newest verified checkpoint of the timeline,
a damaged one moved aside with one line and the one before taken, every rank loading
the same step); the lock is the run folder's (workload.checkpoint.lock). This module
only adapts a loop's objects to the state those read and set: a step and no epoch or
batch of train's (the loop keeps its own position in `extra`, saved in trainer.json),
and a missing scheduler or scaler saved as an empty state.

What a checkpoint records of its loop (its config.json) is which parts were saved and a
digest of the model's parameter names and shapes: a resume with other parts or another
model is refused in one line and nothing is moved aside (the files are good; they belong
to another loop). Importing this module imports no torch; the calls do.
"""

from __future__ import annotations

import hashlib
import json
import os
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

from workload.checkpoint.lock import lock_run_folder
from workload.errors import UsageError
from workload.files import unwritable_reason
from workload.logs import shown

# How the lock's messages name the folder (train names its --output-dir).
NAMED = "Checkpoints(folder)"
WRITER = "workload.checkpoint.Checkpoints"
JSON_VALUES = ("JSON values (dicts with string keys, lists, strings, finite numbers, "
               "booleans, None)")


class _Absent:
    """A scheduler or scaler the loop does not have: saved and restored as an empty state."""

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


@dataclass
class _LoopState:
    """A loop's objects under the names train's snapshot and restore read and set."""
    model: object
    optimizer: object
    schedule: object
    scaler: object
    step: int = 0
    epoch: int = 0
    batch: int = 0
    accuracies: list = field(default_factory=list)


def _state(model, optimizer, scheduler, scaler, step: int = 0) -> _LoopState:
    return _LoopState(model, optimizer, scheduler or _Absent(), scaler or _Absent(), step)


class Checkpoints:
    """Atomic, verified, pickle-free checkpoints of a training loop in `folder`
    (`folder/checkpoints/step-*`, train's layout), the newest `keep` kept. Every rank
    creates it, after init_process_group when there is a group; rank 0 takes the folder's
    lock, and a second writer is refused in one line. `async_save`: a save returns once
    the state is copied to host memory and a writer process commits it
    (workload.checkpoint.background); FSDP2's per-rank shards are saved synchronously."""

    def __init__(self, folder, keep: int = 3, async_save: bool = True):
        from workload.checkpoint.folder import checkpoints_dir
        from workload.distributed import DistInfo

        self.folder, self.keep = _folder(folder), _keep(keep)
        self.async_save = _switch(async_save)
        self.root, self.info = checkpoints_dir(self.folder), DistInfo.of_group()
        self._saves = _saves(self.info, self.async_save)
        self.extra: dict = {}
        if self.info.is_main:
            _make(self.folder)
        self._held: ExitStack | None = ExitStack()
        self._held.enter_context(lock_run_folder(self.folder, self.info, NAMED))

    def resume(self, model, optimizer, scheduler=None, scaler=None) -> int:
        """Load the newest good checkpoint into these objects (every rank calls it) and
        return its step, the step to start from: 0 when there is none. `self.extra` is
        then the `extra` saved with it ({} when none)."""
        from workload.checkpoint.content import check_fits
        from workload.checkpoint.folder import step_name
        from workload.checkpoint.resuming import newest_on_every_rank
        from workload.checkpoint.snapshot import restore

        self._open("resume")
        self._settle()
        state = _state(model, optimizer, scheduler, scaler)
        current = _settings(state)
        step, snapshot = newest_on_every_rank(
            self.root, lambda path: _read(path, current, state), self.info)
        if step is None:
            self.extra = {}
            return 0
        path = self.root / step_name(step)
        snapshot = snapshot or _read(path, current, state)
        _same_loop(snapshot.config, current, path)
        check_fits(snapshot, state, path, schedule_per_step=False)
        restore(snapshot, state, self.info.rank, self.info.world_size)
        self.extra = snapshot.trainer.get("extra", {})
        return state.step

    def save(self, step: int, model, optimizer, scheduler=None, scaler=None,
             extra: dict | None = None) -> Path:
        """Save the loop's state as of `step` (the optimizer steps done: what resume
        returns); every rank calls it. It returns once the checkpoint is complete on disk,
        or with `async_save` once the state is copied (the save before it committed
        first). `extra`: JSON data of the loop's own (its position in the data)."""
        from workload.checkpoint.saving import save_checkpoint
        from workload.checkpoint.snapshot import is_sharded, take_snapshot

        self._open("save")
        _check_step(step)
        extra = _json_extra(extra)
        self._settle()
        state = _state(model, optimizer, scheduler, scaler, step)
        sharded = is_sharded(model)
        snapshot = take_snapshot(state, _settings(state), self.info.world_size, sharded)
        snapshot.trainer["extra"] = extra
        if self.async_save and not sharded:
            return self._saves.hand_over(self.root, snapshot, self.keep)
        return save_checkpoint(self.root, snapshot, self.keep, self.info.is_main,
                               state if sharded else None)

    def wait(self) -> None:
        """Until the save in flight is committed (every rank calls it); its error, if it
        failed, is raised here."""
        self._open("wait")
        self._settle()

    def preempted(self, flag) -> bool:
        """Whether any rank's PreemptionFlag (workload.launch) is set: one all-reduce, so
        that every rank stops at the same step (every rank calls it)."""
        mine = flag.is_set()
        if self.info.world_size == 1:
            return mine
        from workload.distributed import any_rank

        return any_rank([mine], self.info.device)[0]

    def close(self) -> None:
        """Wait for the save in flight to be committed (its error raised here), stop the
        writer and release the folder's lock (every rank calls it)."""
        self._release(agree=True)

    def _release(self, agree: bool) -> None:
        """`agree`: every rank learns whether the save in flight failed (a collective);
        not when leaving on an exception, which another rank may not share."""
        if self._held is None:
            return
        try:
            if agree:
                self._settle()
            else:
                self._saves.wait_quietly()
        finally:
            self._saves.stop()
            self._held.close()
            self._held = None

    def _settle(self) -> None:
        """Wait for the save in flight; every rank learns whether it failed."""
        self._saves.settle()

    def __enter__(self) -> Checkpoints:
        return self

    def __exit__(self, kind, *exc) -> None:
        self._release(agree=kind is None)

    def _open(self, call: str) -> None:
        if self._held is None:
            raise UsageError(f"Checkpoints({str(self.folder)!r}).{call}() after close(): "
                             "create a new Checkpoints for that folder")


# --- the arguments ----------------------------------------------------------------------

def _saves(info, enabled: bool):
    from workload.checkpoint.handover import AsyncSaves

    return AsyncSaves(info, enabled)


def _folder(folder) -> Path:
    if not isinstance(folder, (str, os.PathLike)) or not str(folder):
        raise UsageError(f"Checkpoints: folder {shown(folder)} is not a path; pass the "
                         "folder of this run, e.g. Checkpoints('runs/mine')")
    return Path(folder)


def _make(folder: Path) -> None:
    reason = unwritable_reason(folder, create=True)
    if reason:
        raise UsageError(f"Checkpoints: {reason}; pass a folder you can write (it is "
                         "created when missing), e.g. Checkpoints('runs/mine')")


def _switch(value) -> bool:
    if not isinstance(value, bool):
        raise UsageError(f"Checkpoints: async_save={shown(value)} is not True or False; "
                         "pass async_save=False for saves that return once on disk")
    return value


def _keep(keep) -> int:
    if type(keep) is not int or keep < 1:
        raise UsageError(f"Checkpoints: keep={shown(keep)} is not a whole number of 1 or "
                         "more; pass how many of the newest checkpoints to keep, e.g. keep=3")
    return keep


def _check_step(step) -> None:
    if type(step) is not int or step < 0:
        raise UsageError(f"Checkpoints.save: step {shown(step)} is not a whole number of 0 "
                         "or more; pass the optimizer steps done so far (step + 1 after "
                         "the step with index `step`), the number resume() returns")


def _json_extra(extra) -> dict:
    """`extra` as JSON gives it back (what `ckpt.extra` holds after a resume)."""
    if extra is None:
        return {}
    if not isinstance(extra, dict):
        raise UsageError(f"Checkpoints.save: extra={shown(extra)} is not a dict; pass a "
                         f"dict of {JSON_VALUES}, e.g. extra={{'epoch': epoch, 'batch': i}}")
    try:
        text = json.dumps(extra, allow_nan=False)
    except (TypeError, ValueError, RecursionError) as error:
        raise UsageError(f"Checkpoints.save: extra={shown(extra)} is not JSON-able "
                         f"({error}); pass only {JSON_VALUES}, e.g. the epoch and the batch "
                         "within it") from None
    return json.loads(text)


# --- what a checkpoint records of its loop ------------------------------------------------

def _settings(state: _LoopState) -> dict:
    """The parts a save holds and a digest of the model's parameter names and shapes
    (FSDP2's sharded parameters have their global shapes)."""
    from workload.distributed import unwrap

    live = unwrap(state.model).state_dict()
    shapes = ";".join(f"{name}:{list(tensor.shape)}" for name, tensor in live.items())
    parts = ["model", "optimizer"] + [name for name, part in
                                      (("scheduler", state.schedule), ("scaler", state.scaler))
                                      if not isinstance(part, _Absent)]
    return {"written_by": WRITER, "parts": parts,
            "model": hashlib.sha256(shapes.encode()).hexdigest()[:16], "tensors": len(live)}


def _read(path: Path, current: dict, state: _LoopState):
    """One checkpoint, verified; when it is this loop's, it must fit the live objects
    (CorruptCheckpoint: moved aside, the one before is tried)."""
    from workload.checkpoint.content import check_fits
    from workload.checkpoint.durable import CorruptCheckpoint
    from workload.checkpoint.snapshot import read_checkpoint

    snapshot = read_checkpoint(path)
    if not isinstance(snapshot.trainer.get("extra", {}), dict):
        raise CorruptCheckpoint(f"{path.name}/trainer.json: `extra` is not a dictionary")
    if not _differences(snapshot.config, current):
        check_fits(snapshot, state, path, schedule_per_step=False)
    return snapshot


def _differences(saved: dict, current: dict) -> list[str]:
    if saved.get("written_by") != WRITER:
        return ["it was not written by Checkpoints (a `train` run's folder?)"]
    found = []
    if saved.get("parts") != current["parts"]:
        found.append(f"it holds {shown(saved.get('parts'))}, this resume passes "
                     f"{current['parts']}")
    if (saved.get("model"), saved.get("tensors")) != (current["model"], current["tensors"]):
        found.append(f"its model's {shown(saved.get('tensors'))} tensors have other names "
                     f"or shapes than this model's {current['tensors']}")
    return found


def _same_loop(saved: dict, current: dict, path: Path) -> None:
    found = _differences(saved, current)
    if found:
        raise UsageError(f"{path} belongs to another training loop ({'; '.join(found)}); "
                         "resume with the model and parts it was saved with, or pass another "
                         f"{NAMED} (nothing was moved or deleted)")
