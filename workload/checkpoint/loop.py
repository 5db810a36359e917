"""Checkpoints for your own training loop: `train`'s files, checks and guarantees behind
four calls (docs/your-script.md).

    ckpt = Checkpoints("runs/mine", keep=3)        # rank 0 takes the folder's lock
    start = ckpt.resume(model=model, optimizer=opt, scheduler=sched)     # step, or 0
    ckpt.save(step, model=model, optimizer=opt, scheduler=sched, extra={"epoch": epoch})
    ckpt.close()

Nothing here writes or reads a file itself. This is the user's door to the one
checkpoint object `train` holds too (workload.checkpoint.session's Session): a save is
train's collective save (rank 0 writes under DDP, every rank its shard under FSDP2, the
random states of every rank, a full disk in one line); a resume is train's (the newest
verified checkpoint of the timeline, a damaged one moved aside with one line and the one
before taken, every rank loading the same step); so are the preemption check and the
ending; the lock is the run folder's (workload.checkpoint.lock). This module
only adapts a loop's objects to the state those read and set: a step and no epoch or
batch of train's (the loop keeps its own position in `extra`, saved in trainer.json),
and a missing scheduler or scaler saved as an empty state.

What a checkpoint records of its loop (its config.json) is which parts were saved, a
digest of the model's parameter names and shapes, the class of each part and how many
parameters the optimizer steps: a resume with other parts, another model, another
optimizer or a layer frozen since is refused in one line naming what differs, and so is
one whose state does not fit the live objects; nothing is moved aside (the files are
good; they belong to another loop). A save continues the folder's timeline: a first save
over checkpoints the loop did not resume, or a step before the last one, is refused.
Importing this module imports no torch; the calls do.
"""

from __future__ import annotations

import atexit
import hashlib
import os
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

from workload.checkpoint.lock import lock_run_folder
from workload.checkpoint.meeting import Meeting
from workload.checkpoint.loopargs import (check_parts, every_rank_extra, extra_problem,
                                          folder_path, json_extra, keep_count, make_folder,
                                          rank_extra, step_count, switch)
from workload.errors import UsageError
from workload.logs import logger, shown

# How the lock's messages name the folder (train names its --output-dir).
NAMED = "Checkpoints(folder)"
WRITER = "workload.checkpoint.Checkpoints"


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
    parts: dict = field(default_factory=dict)  # train's energy; a loop has none


def _state(model, optimizer, scheduler, scaler, step: int = 0) -> _LoopState:
    return _LoopState(model, optimizer, scheduler or _Absent(), scaler or _Absent(), step)


class Checkpoints:
    """Atomic, verified, pickle-free checkpoints of a training loop in `folder`
    (`folder/checkpoints/step-*`, train's layout), the newest `keep` kept. Every rank
    creates it, after init_process_group when there is a group; rank 0 takes the folder's
    lock, and a second writer is refused in one line. `async_save`: a save returns once
    the state is copied to host memory and a writer process commits it
    (workload.checkpoint.background); FSDP2's per-rank shards are saved synchronously.
    A loop that ends without close() has its save in flight committed at the
    interpreter's exit (atexit, which workload.launch.end_process runs too)."""

    def __init__(self, folder, keep: int = 3, async_save: bool = True):
        from workload.checkpoint.writer.folder import checkpoints_dir
        from workload.distributed import DistInfo

        self.folder = folder_path(folder)
        self.keep = keep_count(keep)
        self.async_save = switch(async_save)
        self.root = checkpoints_dir(self.folder)
        self.info = DistInfo.of_group()
        self._session = _session(self.info, self.async_save)
        self._meeting = Meeting(self.folder, self.info.rank, self.info.world_size)
        self.extra: dict = {}
        self._last: int | None = None  # the step of the last resume or save (None: neither)
        if self.info.is_main:
            make_folder(self.folder)
        self._held: ExitStack | None = ExitStack()
        self._held.enter_context(lock_run_folder(self.folder, self.info, NAMED))
        self._pid = os.getpid()
        atexit.register(self._at_exit)

    def resume(self, model, optimizer, scheduler=None, scaler=None) -> int:
        """Load the newest good checkpoint into these objects (every rank calls it) and
        return its step, the step to start from: 0 when there is none. `self.extra` is
        then the `extra` this rank saved with it ({} when none)."""
        from workload.checkpoint.session import resume_newest

        self._open("resume")
        check_parts("resume", model, optimizer, scheduler, scaler)
        self._meeting.meet("resume")
        self._session.settle()
        state = _state(model, optimizer, scheduler, scaler)
        current = _settings(state)
        edited = _hyperparameters(optimizer)  # before the resume restores the checkpoint's
        found = resume_newest(self.root, self.info, state, _read,
                              lambda snapshot, path, _: _accept(snapshot, current, state, path))
        if found is None:
            self.extra = {}
            self._last = 0
            return 0
        path, snapshot = found
        if self.info.is_main:
            for line in _hyperparameter_lines(edited, _hyperparameters(optimizer), path):
                logger.warning(line)
        self.extra = rank_extra(snapshot.trainer, self.info.rank)
        self._last = state.step
        return state.step

    def save(self, step: int, model, optimizer, scheduler=None, scaler=None,
             extra: dict | None = None) -> Path:
        """Save the loop's state as of `step` (the optimizer steps done: what resume
        returns); every rank calls it (a collective, as resume, wait and close are: the
        ranks meet first, and a rank that does not come is named within seconds,
        workload.checkpoint.meeting). It
        returns once the checkpoint is complete on disk, or with `async_save` once the
        state is copied (the save before it committed first). `extra`: JSON data of the
        loop's own (its position in the data); each rank's is kept."""
        from workload.checkpoint.snapshot import is_sharded, take_snapshot

        self._open("save")
        step = step_count(step)
        check_parts("save", model, optimizer, scheduler, scaler)
        extra = json_extra(extra)
        self._meeting.meet("save", f"of step {step}")  # before the save's first collective
        self._session.settle()
        self._goes_on(step)
        state = _state(model, optimizer, scheduler, scaler, step)
        sharded = is_sharded(model)
        snapshot = take_snapshot(state, _settings(state), self.info.world_size, sharded)
        snapshot.trainer.update(every_rank_extra(extra, self.info.world_size))
        self._last = step
        return self._session.save(self.root, snapshot, self.keep, state if sharded else None)

    def wait(self) -> None:
        """Until the save in flight is committed (every rank calls it); its error, if it
        failed, is raised here."""
        self._open("wait")
        self._meeting.meet("wait")
        self._session.settle()

    def preempted(self, flag) -> bool:
        """Whether any rank's PreemptionFlag (workload.launch) is set: one all-reduce, so
        that every rank stops at the same step (every rank calls it). A save in flight that
        failed meanwhile is raised here, on every rank, in the same all-reduce."""
        return self._session.preempted(flag)[0]

    def close(self) -> None:
        """Wait for the save in flight to be committed (its error raised here), stop the
        writer and release the folder's lock (every rank calls it)."""
        self._release(agree=True)

    def _goes_on(self, step: int) -> None:
        """A save continues this folder's timeline: a first save over checkpoints the loop
        did not resume from, or a step before the last one, would start another."""
        if self._last is None:
            newest = _newest_saved(self.root, self.info)
            if newest is not None:
                raise UsageError(
                    f"Checkpoints.save: {self.root} holds checkpoints (the newest at step "
                    f"{newest}) and this loop saves before calling resume(), which would "
                    "start another timeline over them; call ckpt.resume(model=..., "
                    "optimizer=...) first and continue from the step it returns, or pass "
                    f"another {NAMED} (nothing was written)")
        elif step < self._last:
            raise UsageError(
                f"Checkpoints.save: step {step} is before step {self._last}, where this loop "
                "last resumed or saved; a save of an earlier step would start another "
                "timeline over the later checkpoints: pass the optimizer steps done so far "
                f"(they only grow), or pass another {NAMED} to start afresh (nothing was "
                "written)")

    def _release(self, agree: bool) -> None:
        """`agree`: every rank learns whether the save in flight failed (a collective);
        not when leaving on an exception, which another rank may not share."""
        if self._held is None:
            return
        atexit.unregister(self._at_exit)
        try:
            if agree:
                self._meeting.meet("close")
            self._session.end(agree)
        finally:
            self._session.stop()  # also when a rank did not come to the meeting
            self._held.close()
            self._held = None

    def _at_exit(self) -> None:
        """The interpreter exits and the loop did not close(): the save in flight is
        committed first (rank 0 alone; no collective: the other ranks may be gone), and the
        lock released. Not in a forked child (a DataLoader worker), whose parent's it is."""
        if os.getpid() != self._pid or self._held is None:
            return
        step = self._session.in_flight
        if step is not None:
            logger.warning(f"{NAMED} {self.folder}: the loop ended without close(); waiting "
                           f"for the save of step {step} to be committed")
        self._release(agree=False)

    def __enter__(self) -> Checkpoints:
        return self

    def __exit__(self, kind, *exc) -> None:
        self._release(agree=kind is None)

    def _open(self, call: str) -> None:
        if self._held is None:
            raise UsageError(f"Checkpoints({str(self.folder)!r}).{call}() after close(): "
                             "create a new Checkpoints for that folder")


# --- the arguments ----------------------------------------------------------------------

def _session(info, background: bool):
    from workload.checkpoint.session import Session

    return Session(info, background)


# --- what a checkpoint records of its loop ------------------------------------------------

def _settings(state: _LoopState) -> dict:
    """The parts a save holds, a digest of the model's parameter names and shapes (FSDP2's
    sharded parameters have their global shapes), the class of each part and how many
    parameters each of the optimizer's groups steps (a frozen layer's are not)."""
    from workload.distributed import unwrap

    live = unwrap(state.model).state_dict()
    shapes = ";".join(f"{name}:{list(tensor.shape)}" for name, tensor in live.items())
    present = [(name, part) for name, part in (("optimizer", state.optimizer),
                                               ("scheduler", state.schedule),
                                               ("scaler", state.scaler))
               if not isinstance(part, _Absent)]
    return {"written_by": WRITER, "parts": ["model"] + [name for name, _ in present],
            "model": hashlib.sha256(shapes.encode()).hexdigest()[:16], "tensors": len(live),
            "classes": {name: type(part).__name__ for name, part in present},
            "optimized": [len(group["params"]) for group in state.optimizer.param_groups]}


def _read(path: Path):
    """One checkpoint, verified, its files read and checked (CorruptCheckpoint: moved
    aside, the one before is tried). Whether it fits the live objects is decided after,
    on every rank: one of this loop that does not is another loop's, never moved."""
    from workload.checkpoint.writer.durable import CorruptCheckpoint
    from workload.checkpoint.snapshot import read_checkpoint

    snapshot = read_checkpoint(path)
    problem = extra_problem(snapshot.trainer)
    if problem:
        raise CorruptCheckpoint(f"{path.name}/trainer.json: {problem}")
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
    classes = saved.get("classes") if isinstance(saved.get("classes"), dict) else {}
    for name, kind in current["classes"].items():  # a checkpoint of before: not recorded
        if name in classes and classes[name] != kind:
            found.append(f"its {name} is {shown(classes[name])}, this resume passes {kind}")
    if saved.get("optimized", current["optimized"]) != current["optimized"]:
        found.append(f"its optimizer steps {shown(saved['optimized'])} parameters (per "
                     f"group), this one {current['optimized']} (a layer frozen or thawed?)")
    return found


def _hyperparameters(optimizer) -> list[dict]:
    """Each parameter group's settings (lr, momentum, ...), without its parameters."""
    return [{key: value for key, value in group.items() if key != "params"}
            for group in optimizer.param_groups]


def _hyperparameter_lines(loop: list[dict], restored: list[dict], path: Path) -> list[str]:
    """One line per setting of the loop's optimizer that the resume put back otherwise
    (torch's load_state_dict restores the checkpoint's lr, momentum, ...): a loop edited
    between jobs learns that its edit did not take, and how to make it take."""
    lines = []
    for index, (mine, theirs) in enumerate(zip(loop, restored)):
        for key in sorted(set(mine) & set(theirs)):
            if not _same(mine[key], theirs[key]):
                lines.append(
                    f"Checkpoints.resume: the optimizer's {key} is {shown(mine[key])} in this "
                    f"loop (group {index}) and {shown(theirs[key])} in {path.name}: the "
                    f"checkpoint's is restored; to train on with the loop's, set it after "
                    f"resume(), e.g. optimizer.param_groups[{index}][{key!r}] = "
                    f"{shown(mine[key])}")
    return lines


def _same(one, other) -> bool:
    try:
        return bool(one == other)
    except (RuntimeError, TypeError, ValueError):  # tensors of several numbers
        return repr(one) == repr(other)


def _accept(snapshot, current: dict, state: _LoopState, path: Path) -> None:
    """The checkpoint chosen is this loop's (its recorded settings) and fits its objects."""
    _same_loop(snapshot.config, current, path)
    _fits(snapshot, state, path)


def _same_loop(saved: dict, current: dict, path: Path) -> None:
    found = _differences(saved, current)
    if found:
        raise UsageError(f"{path} belongs to another training loop ({'; '.join(found)}); "
                         "resume with the model and parts it was saved with, or pass another "
                         f"{NAMED} (nothing was moved or deleted)")


def _fits(snapshot, state: _LoopState, path: Path) -> None:
    """Every tensor, number and switch of the checkpoint against the live objects: one of
    this loop that does not fit them is refused like another loop's, nothing moved."""
    from workload.checkpoint.content import check_fits
    from workload.checkpoint.writer.durable import CorruptCheckpoint

    try:
        check_fits(snapshot, state, path, schedule_per_step=False)
    except CorruptCheckpoint as error:
        raise UsageError(f"{path} does not fit this loop's objects ({error}); resume with "
                         "the model, optimizer and parts it was saved with, or pass another "
                         f"{NAMED} (nothing was moved or deleted)") from None


def _newest_saved(root: Path, info) -> int | None:
    """Rank 0's newest complete checkpoint in `root`, on every rank (None: none)."""
    from workload.checkpoint.writer.folder import complete_steps
    from workload.distributed import main_rank_numbers

    steps = complete_steps(root) if info.is_main else []
    found, newest = main_rank_numbers([bool(steps), steps[-1][0] if steps else 0], info)
    return newest if found else None
