"""The one save entry, for `train`'s Checkpointer and a user's loop's Checkpoints alike:
`Saves.save` hands a save to the writer process or makes it in this process, and either
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

from pathlib import Path

from workload.checkpoint.background import NoBackground, WriterHandle
from workload.checkpoint.writer.diskfull import save_in_one_line
from workload.checkpoint.writer.folder import step_name
from workload.checkpoint.writer.store import end_save
from workload.checkpoint.inprocess import make_save_folder, save_checkpoint, write_checkpoint
from workload.errors import UsageError
from workload.held import let_go
from workload.logs import logger


class Saves:
    """A run's saves: rank 0's handle on its writer process and the save in flight (at
    most one); `background` False: nothing is handed over, and `settle` costs no
    collective."""

    def __init__(self, info, background: bool):
        self.info = info
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

    def failed_by_now(self) -> bool:
        """Rank 0, without waiting: whether the save in flight failed (the caller agrees
        on it with the other ranks and `settle`s, which raises it)."""
        return self.handle is not None and self.handle.failed_by_now()

    def settle(self) -> None:
        """Every rank calls it: wait for the save in flight (rank 0's writer process); its
        failure (DiskFull, WriterFailed) is raised on rank 0, a one-line UsageError on the
        others."""
        failure = None
        if self.handle is not None:
            try:
                self.handle.wait()
            except Exception as error:  # noqa: BLE001 (raised below, on every rank)
                failure = error
        failed = failure is not None
        if self.enabled and self.info.world_size > 1:
            from workload.distributed import any_rank

            failed = any_rank([failed], self.info.device)[0]
        if failure is not None:
            raise failure
        if failed:
            raise UsageError("rank 0's checkpoint save failed (see its error); the last "
                             "committed checkpoint is where a new run resumes")

    def wait_quietly(self) -> None:
        """Leaving on an exception (no collective: another rank may not be there): the save
        in flight is committed or not, and its failure is a warning, not an error in place
        of the one that ended the loop."""
        if self.handle is None:
            return
        try:
            self.handle.wait()
        except Exception as error:  # noqa: BLE001 (the loop's own exception goes on)
            logger.warning(f"the checkpoint save in flight failed too: {error}")

    def stop(self) -> None:
        """End the writer process (after `settle` or `wait_quietly`) and free the staging buffer."""
        if self.handle is not None:
            self.handle.stop()
            self.handle = None
