"""The one checkpoint object behind both doors, `train`'s Checkpointer
(workload.checkpoint.policy) and a user's loop's Checkpoints (workload.checkpoint.loop):
`Session` holds the save entry, the resume from the newest checkpoint of the timeline,
the preemption check and the ending; each door keeps only its arguments and when it
saves.

The save: `Session.save` hands a save to the writer process or makes it in this process, and either
way the checkpoint is then copied into the run folder (from the local tier) and the older
ones pruned (workload.checkpoint.writer.store's `end_save`, in whichever process saved).
When to save is the caller's.

Handed over (--checkpoint-async, the default, and Checkpoints(async_save=True)): rank 0
stages the snapshot and hands it to its writer process through the writer's handle
(workload.checkpoint.background); the other ranks have nothing to write. Saved in this
process (workload.checkpoint.inprocess): without the writer, and FSDP2's per-rank shards,
which every rank writes into the run folder itself (the writer and the local tier take
rank 0's state only). Before the next save, a resume, the end of the run or its exit for a
requeue, `settle` waits for the save in flight; with a process group every rank then
learns (one all-reduce) whether it failed, so that all stop at the same point and none
waits in a collective for a rank that left. Where no folder has room for the staging
buffer, or the writer process cannot start (a pids limit), rank 0 saves in this process
from then on (said once); only rank 0 knows, and the others' steps stay the same.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from workload import distributed
from workload.checkpoint.background import NoBackground, WriterHandle
from workload.checkpoint.inprocess import make_save_folder, save_checkpoint, write_checkpoint
from workload.checkpoint.snapshot import restore
from workload.checkpoint.writer.diskfull import save_in_one_line
from workload.checkpoint.writer.folder import newest_loadable, step_name
from workload.checkpoint.writer.store import (OldFormat, Snapshot, end_save,
                                              old_format_message)
from workload.errors import UsageError
from workload.held import let_go
from workload.logs import logger


class Session:
    """A run's checkpoints: rank 0's handle on its writer process and the save in flight
    (at most one); `background` False: nothing is handed over, and `settle` costs no
    collective."""

    def __init__(self, info, background: bool, flag=None):
        self.info = info
        # The loop's PreemptionFlag (workload.launch): a wait for the writer acts on it.
        # train's is given here; a user's loop gives its own to `preempted`.
        self.flag = flag
        self.enabled = background
        self.handle: WriterHandle | None = None
        self.staging_refused = False  # rank 0: no staging buffer or no writer process

    def save(self, run_root: Path, snapshot, keep: int, sharded_state=None,
             local: Path | None = None) -> Path:
        """Every rank calls it (after `settle`). `sharded_state`: the live state whose
        FSDP2 shards every rank writes (None: not sharded); `local`: the local tier's
        checkpoints (--checkpoint-local), written first, then copied into `run_root`. The
        checkpoint's path in the run folder, once committed."""
        sharded = sharded_state is not None
        root = local if local is not None and not sharded else run_root
        copy_to = run_root if root != run_root else None
        with save_in_one_line(snapshot.trainer["step"], root):
            if sharded or not self.enabled:
                return save_checkpoint(root, snapshot, keep, self.info.is_main,
                                       sharded_state, copy_to)
            if self.info.is_main:
                self._hand_over(root, snapshot, keep, copy_to)
        return run_root / step_name(snapshot.trainer["step"])

    def _hand_over(self, root: Path, snapshot, keep: int, copy_to: Path | None) -> None:
        """Rank 0: the snapshot staged for the writer process, or saved here where the
        buffer has no room or the writer cannot start."""
        tmp = make_save_folder(root, snapshot, sharded=False)
        if self.staging_refused or not self._staged(root, tmp, snapshot, keep, copy_to):
            try:
                end_save(write_checkpoint(root, tmp, snapshot), keep, copy_to)  # no collective
            finally:
                let_go(tmp)

    def _staged(self, root: Path, tmp: Path, snapshot, keep: int, copy_to) -> bool:
        self.handle = self.handle or WriterHandle()
        try:
            self.handle.submit(root, tmp, snapshot, keep, copy_to)
            return True
        except NoBackground as error:  # said once: every later save is in this process
            self.staging_refused = True
            self.handle.stop()
            self.handle = None
            logger.warning(f"{error}: saving synchronously instead{error.hint}")
            return False

    @property
    def in_flight(self) -> int | None:
        """The step being written (rank 0), None when none is."""
        return self.handle.in_flight if self.handle is not None else None

    def waited_writer(self):
        """The writer process the loop waits for now (its StallWatch, which names it and
        says what to do), None while it waits for none; read by train's stall watchdog
        from its own thread."""
        handle = self.handle
        return handle.waited if handle is not None else None

    def failed_by_now(self) -> bool:
        """Rank 0, without waiting: whether the save in flight failed (the caller agrees
        on it with the other ranks and `settle`s, which raises it)."""
        return self.handle is not None and self.handle.failed_by_now()

    def preempted(self, flag, *also: bool) -> list[bool]:
        """Every rank calls it at a step boundary: whether any rank's PreemptionFlag
        (workload.launch) is set, then whether any rank's each of `also` is, in one
        all-reduce, so that every rank stops at the same step. A save in flight that
        failed meanwhile is raised here, on every rank, from the same all-reduce."""
        self.flag = flag  # the one the waits act on from now
        found = [flag.is_set(), *also, self.failed_by_now()]
        if self.info.world_size > 1:
            found = distributed.any_rank(found, self.info.device)
        if found[-1]:
            self.settle()
        return found[:-1]

    def settle(self, say: bool = False) -> None:
        """Every rank calls it: wait for the save in flight (rank 0's writer process); its
        failure (DiskFull, WriterFailed) is raised on rank 0, a one-line UsageError on the
        others. `say`: a line once it is committed (a run's last save)."""
        step = self.in_flight
        failure = None
        if self.handle is not None:
            try:
                self.handle.wait(self.flag)
            except Exception as error:  # noqa: BLE001 (raised below, on every rank)
                failure = error
        failed = failure is not None
        if self.enabled and self.info.world_size > 1:
            failed = distributed.any_rank([failed], self.info.device)[0]
        if failure is not None:
            raise failure
        if failed:
            raise UsageError("rank 0's checkpoint save failed (see its error); the last "
                             "committed checkpoint is where a new run resumes")
        if say and step is not None:
            logger.info(f"checkpoint at step {step} committed by the background writer")

    def wait_quietly(self) -> None:
        """Leaving on an exception (no collective: another rank may not be there): the save
        in flight is committed or not, and its failure is a warning, not an error in place
        of the one that ended the loop."""
        if self.handle is None:
            return
        try:
            self.handle.wait(self.flag)
        except Exception as error:  # noqa: BLE001 (the loop's own exception goes on)
            logger.warning(f"the checkpoint save in flight failed too: {error}")

    def end(self, agree: bool, say: bool = False) -> None:
        """The end of the run or the loop: the save in flight committed, with every rank's
        agreement (`settle`; `say`: with a line) or, `agree` False, leaving on an exception
        another rank may not share, without a collective (`wait_quietly`); then the writer
        stopped."""
        try:
            if agree:
                self.settle(say)
            else:
                self.wait_quietly()
        finally:
            self.stop()

    def stop(self) -> None:
        """End the writer process (after `settle` or `wait_quietly`) and free the staging buffer."""
        if self.handle is not None:
            self.handle.stop()
            self.handle = None


# --- resuming ---------------------------------------------------------------------------

def resume_newest(root: Path, info, state, choose: Callable[[Path], Snapshot],
                  accept: Callable[[Snapshot, Path, bool], None],
                  read: Callable[[Path], Snapshot] | None = None
                  ) -> tuple[Path, Snapshot] | None:
    """Every rank, both doors: the newest checkpoint of `root`'s timeline restored into
    `state`, the same step on every rank. Rank 0 chooses it with `choose` (a corrupt one
    is moved aside and the one before tried, workload.checkpoint.writer.folder); the other
    ranks read it with `read` (`choose` when None); `accept(snapshot, path, chosen_here)`
    refuses one of another run or one that does not fit (`chosen_here`: `choose` read it
    on this rank). Its path and snapshot; None when there is none."""
    step, snapshot = newest_on_every_rank(root, choose, info)
    if step is None:
        return None
    path = root / step_name(step)
    chosen_here = snapshot is not None
    snapshot = snapshot or (read or choose)(path)
    accept(snapshot, path, chosen_here)
    restore(snapshot, state, info.rank, info.world_size)
    return path, snapshot


def newest_on_every_rank(root: Path, load: Callable[[Path], Snapshot], info
                         ) -> tuple[int | None, Snapshot | None]:
    """Rank 0 finds the newest checkpoint that `load` takes (its snapshot is returned
    there) and every rank learns its step (None: there is none), so that all load the
    same one; one of the old format stops every rank."""
    snapshot = None
    refused = None
    if info.is_main:
        try:
            snapshot = newest_loadable(root, load)
        except OldFormat as error:  # never moved aside: the run stops, nothing is lost
            refused = str(error)
    step = snapshot.trainer["step"] if snapshot else 0
    old_format, found, step = distributed.main_rank_numbers(
        [refused is not None, snapshot is not None, step], info)
    if old_format:
        raise UsageError(refused or old_format_message(root))
    return (step if found else None), snapshot
