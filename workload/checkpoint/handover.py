"""The hand-over of a save to the background writer, for `train`'s Checkpointer and a
user's loop's Checkpoints alike: one home for what both do around workload.checkpoint.
background.

Rank 0 stages the snapshot and hands it to its writer process; the other ranks have
nothing to write (FSDP2's per-rank shards are saved synchronously by the caller). Before
the next save, a resume, the end of the run or its exit for a requeue, `settle` waits for
the save in flight; with a process group every rank then learns (one all-reduce) whether
it failed, so that all stop at the same point and none waits in a collective for a rank
that left. Where no folder has room for the staging buffer, or the writer process
cannot start (a pids limit), rank 0 saves synchronously from then on (said once); only
rank 0 knows, and the others' steps stay the same.
"""

from __future__ import annotations

from pathlib import Path

from workload.checkpoint.background import NoBackground, Writer
from workload.checkpoint.folder import prune, step_name
from workload.checkpoint.local import copy_to_run
from workload.checkpoint.saving import commit, start_save
from workload.errors import UsageError
from workload.logs import logger


class AsyncSaves:
    """Rank 0's background writer and the save in flight (at most one); `enabled` False:
    nothing is handed over, and `settle` costs no collective."""

    def __init__(self, info, enabled: bool):
        self.info, self.enabled = info, enabled
        self.writer: Writer | None = None
        self.staging_refused = False  # rank 0: no staging buffer or no writer process

    def hand_over(self, root: Path, snapshot, keep: int, copy_to: Path | None = None
                  ) -> Path:
        """Every rank calls it (after `settle`): rank 0 stages the snapshot and hands it to
        the writer, or saves it itself where the buffer has no room. `copy_to`: the run
        folder's checkpoints, when `root` is the local tier's (--checkpoint-local). The
        checkpoint's path once committed."""
        if self.info.is_main:
            tmp = start_save(root, snapshot, sharded=False)
            if self.staging_refused or not self._staged(root, tmp, snapshot, keep, copy_to):
                saved = commit(root, tmp, snapshot, keep)  # rank 0 alone: no collective
                if copy_to is not None:
                    copy_to_run(saved, copy_to)
                    prune(copy_to, keep, newest=snapshot.trainer["step"])
        return (copy_to or root) / step_name(snapshot.trainer["step"])

    def _staged(self, root: Path, tmp: Path, snapshot, keep: int, copy_to) -> bool:
        self.writer = self.writer or Writer()
        try:
            self.writer.submit(root, tmp, snapshot, keep, copy_to)
            return True
        except NoBackground as error:  # said once: every later save is synchronous
            self.staging_refused = True
            self.writer.stop()
            self.writer = None
            logger.warning(f"{error}: saving synchronously instead{error.hint}")
            return False

    @property
    def in_flight(self) -> int | None:
        """The step being written (rank 0), None when none is."""
        return self.writer.in_flight if self.writer is not None else None

    def failed_by_now(self) -> bool:
        """Rank 0, without waiting: whether the save in flight failed (the caller agrees
        on it with the other ranks and `settle`s, which raises it)."""
        return self.writer is not None and self.writer.failed_by_now()

    def settle(self) -> None:
        """Every rank calls it: wait for the save in flight (rank 0's writer); its failure
        (DiskFull, WriterFailed) is raised on rank 0, a one-line UsageError on the others."""
        failure = None
        if self.writer is not None:
            try:
                self.writer.wait()
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
        if self.writer is None:
            return
        try:
            self.writer.wait()
        except Exception as error:  # noqa: BLE001 (the loop's own exception goes on)
            logger.warning(f"the checkpoint save in flight failed too: {error}")

    def stop(self) -> None:
        """End the writer (after `settle` or `wait_quietly`) and free the staging buffer."""
        if self.writer is not None:
            self.writer.stop()
            self.writer = None
