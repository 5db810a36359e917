"""A save that runs out of disk space: one line that names the folder and the space, and
the partial files removed; torch-free, for the background writer process too. And the one
line for any write the run cannot go on without that failed for a reason the user must
fix (`write_problem`: a full disk, a file system turned read-only), whichever process
wrote.

A writer need not report a full disk as OSError(ENOSPC) (torch.save's zip writer raised a
RuntimeError, "unexpected pos ..."), so any failure of a save is followed by a look at the
free space: when it is less than a checkpoint needs, the failure is a full disk. The final
model's write (model.safetensors) and --checkpoint-local's copy get the same treatment.
"""

from __future__ import annotations

import errno
import os
import re
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

from workload import errors
from workload.checkpoint.writer.folder import complete_steps
from workload.errors import UsageError
from workload.held import named_for_the_user, remove_held

# The failures of a disk with no room left: out of blocks or inodes, or over a quota.
DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


class DiskFull(UsageError):
    """No space (or no quota) left for a checkpoint; the partial save is gone."""


def needed_bytes(root: Path, estimate: int) -> int:
    """About what one checkpoint takes: the newest complete one's size, or `estimate` (its
    tensors' bytes) when that is more."""
    steps = complete_steps(root)
    if steps:
        on_disk = sum(p.stat().st_size for p in steps[-1][1].rglob("*") if p.is_file())
        estimate = max(estimate, on_disk)
    return estimate


def free_bytes(folder: Path) -> int:
    stats = os.statvfs(folder)
    return stats.f_bavail * stats.f_frsize


def mib(count: int) -> str:
    return f"{count / 2**20:.1f} MiB"


def errno_of(error: Exception) -> int | None:
    """The errno of a failed write: an OSError's, or the one a writer's own error names
    (safetensors': "Read-only file system (os error 30)")."""
    if isinstance(error, OSError):
        return error.errno
    found = re.search(r"\(os error (\d+)\)", str(error))
    return int(found.group(1)) if found else None


def write_problem(number: int | None, where) -> str | None:
    """The errors module's line for a write the user must fix, with what a run does after
    the fix; None for another failure."""
    line = errors.write_problem(number, where)
    return line and (f"{line} and start the run again: it resumes from its last complete "
                     "checkpoint")


class SaveFailed(UsageError):
    """A save in this process failed on a file or folder (a neighbour's file in its way, a
    folder renamed under it): one line, as the writer process's failure is."""


def failure_line(error: Exception, where) -> str:
    """What a failed write says in one line: write_problem's line when the user must fix
    it, else the error's kind and message (the file it names included)."""
    return (write_problem(errno_of(error), getattr(error, "filename", None) or where)
            or named_for_the_user(f"{type(error).__name__}: {error}"))


@contextmanager
def save_in_one_line(step: int, root: Path):
    """A save in this process whose OSError ends the run in one line (SaveFailed) that
    names the step and the file, as the writer process's failure does (background's
    WriterFailed), never a traceback."""
    try:
        yield
    except OSError as error:
        raise SaveFailed(f"the checkpoint save could not save step {step}: "
                         f"{failure_line(error, root)}") from None


def full_disk(error: Exception, free: int, need: int) -> bool:
    """Whether a failed write ran out of space (or quota): ENOSPC or EDQUOT, raised as an
    OSError or inside a writer's own error, or less free space than the write needs."""
    return errno_of(error) in DISK_FULL or free < need


@contextmanager
def _full_disk_is_one_line(folder: Path, need, what: str, cleanup=lambda: None):
    """Run a write; if it fails, `cleanup` its partial files, and report a full disk in
    one line naming `what` could not be written and the space (any other failure is raised
    as it was). `need` is called only after a failure."""
    try:
        yield
    except Exception as error:
        cleanup()
        needed = need()
        free = free_bytes(folder) if folder.is_dir() else 0
        if not full_disk(error, free, needed):
            raise
        raise DiskFull(f"no space left to {what} in {folder}: {mib(free)} free, it needs "
                       f"about {mib(needed)}; the partial files were removed. Free space on "
                       "that file system and start the run again: it resumes from the last "
                       "complete checkpoint") from None


def guarded_final_model(out: Path, need: int):
    """Write the final model (model.safetensors, whose writer removes its partial file)
    with a checkpoint save's full-disk line and exit status."""
    return _full_disk_is_one_line(out, lambda: need, "write the final model")


def guarded_save(root: Path, tmp: Path, estimate: Callable[[], int]):
    """Run a save; if it fails, remove its partial folder, and report a full disk in one
    line (any other failure is raised as it was). `estimate`: the save's tensor bytes,
    called only after a failure."""
    return _full_disk_is_one_line(root, lambda: needed_bytes(root, estimate()),
                                  "save a checkpoint",
                                  lambda: remove_held(tmp, root))


def guarded_copy(root: Path, tmp: Path, source: Path):
    """Copy a committed checkpoint (--checkpoint-local) into `root`: a full disk as for a
    save, in one line, the partial copy removed."""
    return _full_disk_is_one_line(
        root, lambda: sum(p.stat().st_size for p in source.rglob("*") if p.is_file()),
        "copy a checkpoint into the run folder", lambda: remove_held(tmp, root))
