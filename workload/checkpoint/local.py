"""The node-local tier (--checkpoint-local DIR, e.g. $SLURM_TMPDIR or a node's NVMe): each
checkpoint is committed there first, then copied into the run folder, where it is taken
only once complete and verified.

Both places commit the same way (workload.checkpoint.writer.folder: the commit point):
the local save is an ordinary one into `DIR/hpc-train-<run>-<digest>/checkpoints/` (the digest of
the run folder's absolute path, so that runs sharing a node's disk never mix), and the
copy goes into the run folder's `.tmp-step-N`, every file fsynced, and is verified against
its manifest before it is committed (store.py's `copy_to_run`). store.py's `end_save` is
how every save ends, the copy then the pruning in both places; with --checkpoint-async the
writer process runs it, without, rank 0 does.

A resume (--resume auto) first looks at the local tier: a verified checkpoint there newer
than the run folder's (the job ended before its copy did) is copied into the run folder
the same way, with one line, and the resume then reads the run folder as always, on every
rank. Only what this job can see counts: another node's local disk is not.

The run folder is the truth, the tier only its node's copy. So the tier's checkpoints
count only for the run folder they were saved for: both hold the same random id
(RUN_ID), and a tier whose run folder was deleted or replaced (`rm -rf` and the same
command again) is emptied with one line, never resumed. A rollback (--resume PATH) empties
the tier too: its later copies would otherwise undo the rollback at the next resume.

The tier's folder `DIR/hpc-train-<run>-<digest>` is private: made with mode 0700, and
refused before any work when it is a link, another uid's, or writable by others (who
could have put a checkpoint there for the run to adopt); so is a DIR others may write
without the sticky bit /tmp has (they could swap the tier's folder for one of theirs).

Importing this module imports no torch (train checks DIR before any work); the copy and
the resume import the checkpoint modules when called.
"""

from __future__ import annotations

import hashlib
import os
import stat
import uuid
from pathlib import Path

from workload.errors import UsageError
from workload.files import (open_regular, private_folder_problem, replace_file,
                            umask_mode, unwritable_reason)
from workload.held import held_path, hold_folder, holding
from workload.logs import logger
from workload.runfolder import RunFolder

FLAG = "--checkpoint-local"
# The id of the run folder the tier's checkpoints belong to: in the run folder's
# checkpoints/ and in the tier's folder.
RUN_ID = ".local-tier-id"


def local_root(local: str, out: str | Path) -> Path:
    """This run's checkpoints folder in the local tier."""
    run = Path(out).expanduser().absolute()
    digest = hashlib.sha256(str(run).encode()).hexdigest()[:12]
    return Path(local).expanduser().absolute() / f"hpc-train-{run.name}-{digest}" / "checkpoints"


def check_local(local: str, out: str) -> None:
    """A usable DIR, before any work: a folder this process can write, outside the run
    folder (UsageError in one line otherwise)."""
    if not local:
        return
    folder = Path(local).expanduser().absolute()
    run = Path(out).expanduser().absolute()
    if folder.resolve().is_relative_to(run.resolve()):
        raise UsageError(f"{FLAG} {local} is inside the run folder {out}; pass a folder on "
                         f"a node-local disk outside it, e.g. {FLAG} $SLURM_TMPDIR, or leave "
                         "the flag out")
    reason = (unwritable_reason(folder, create=True) or _shared_problem(folder)
              or private_folder_problem(local_root(local, out).parent, close_looser=False))
    if reason:
        raise UsageError(f"{FLAG} {local}: {reason}; pass a folder of your own on a "
                         f"node-local disk, e.g. {FLAG} $SLURM_TMPDIR, or leave the flag out")


def _shared_problem(folder: Path) -> str | None:
    """Why others could swap the tier's folder inside `folder` (None: they cannot)."""
    info = os.stat(folder)
    if info.st_mode & 0o022 and not info.st_mode & stat.S_ISVTX:
        return (f"{folder} may be written by others (mode {stat.filemode(info.st_mode)}) "
                "without the sticky bit, so they could replace the checkpoints kept there")
    return None


def promote_newer(local: Path, run_root: Path, keep: int) -> None:
    """Rank 0, at a resume: the local tier's newest verified checkpoint, when it is newer
    than the run folder's `latest`, copied into the run folder (one line)."""
    from workload.checkpoint.writer.diskfull import save_in_one_line
    from workload.checkpoint.writer.folder import latest_step, newest_loadable, step_name
    from workload.checkpoint.writer.store import end_save, verify

    if not local.is_dir():
        return
    found = newest_loadable(local, lambda path: (path, verify(path)))
    head = latest_step(run_root)
    if found is None:
        return
    path = found[0]
    step = int(path.name.removeprefix("step-"))
    if head is not None and step <= head:
        return
    where = f"step {head}" if head is not None else "none"
    with save_in_one_line(step, run_root):  # a name someone put in its way: one line
        end_save(path, keep, copy_to=run_root)
    logger.warning(f"{FLAG}: {path} is newer than the run folder's newest checkpoint "
                   f"({where}): the job ended before its copy did; copied into {run_root} "
                   f"as {step_name(step)}, verified, and resuming from it")


def remove_local(local: str, out: str | Path) -> bool:
    """The local tier's checkpoints of this run folder removed (--overwrite, a rollback,
    a run folder deleted); its private folder stays. Whether there were any."""
    from workload.checkpoint.writer.folder import remove_tree

    root = local_root(local, out) if local else None
    if root is None or not (root.is_dir() or root.is_symlink()):
        return False
    remove_tree(root)
    return True


def bind_to_run(local: str, folder: RunFolder) -> None:
    """Rank 0, before a resume: the tier holds checkpoints of this run folder only. The
    run folder's id is made when it has none; a tier of another id (a run folder deleted
    and made again) is emptied with one line. The run folder's id counts only when it is
    this user's own file that no one else may write (the run folder may be the group's):
    one a group member rewrote or put there says nothing, and the tier's id is written
    in its place, with a line, rather than the tier's newer checkpoints deleted. Both id
    files are reached through descriptors: the held run folder's `checkpoints/` (opened
    without following a link) and the tier's folder (this user's, private): a neighbour
    who renames the run folder or `checkpoints/` and puts a link at its name meanwhile
    gets nothing written through it."""
    folder.checkpoints.mkdir(parents=True, exist_ok=True)
    tier = hold_folder(local_root(local, folder.root).parent)
    try:
        with holding(folder.checkpoints) as run_root:
            _bind(local, folder.root, run_root, held_path(tier))
    finally:
        os.close(tier)


def _bind(local: str, out: Path, run_root: Path, tier: Path) -> None:
    """bind_to_run with the run folder's `checkpoints/` and the tier's folder held."""
    mine, distrust = _read_own_id(run_root / RUN_ID)
    theirs = _read_own_id(tier / RUN_ID)[0]
    if distrust and theirs:
        logger.warning(f"{FLAG}: {RunFolder(out).checkpoints / RUN_ID} {distrust}, so it "
                       "cannot tell whose run the tier's checkpoints are; replaced by the "
                       "tier's own id")
        mine = theirs
        _write_id(run_root / RUN_ID, mine)
    if mine is None:
        mine = uuid.uuid4().hex
        _write_id(run_root / RUN_ID, mine)
    if theirs == mine:
        return
    if remove_local(local, out):
        logger.warning(f"{FLAG}: {local_root(local, out).parent} held checkpoints of a run "
                       f"whose folder {out} is gone or was replaced; not resumed (the run "
                       "folder is the truth), removed")
    _write_id(tier / RUN_ID, mine)


def _write_id(path: Path, run_id: str) -> None:
    """An id file, readable as the umask lets others read it, writable by this user alone."""
    replace_file(path, run_id.encode() + b"\n", mode=umask_mode(0o644))


def _read_own_id(path: Path) -> tuple[str | None, str]:
    """The id in `path` and "" when it is this user's own file that no one else may write;
    else (None, why it is not trusted), or (None, "") when there is none."""
    try:
        fd = open_regular(path, follow_links=False)
    except OSError:
        return None, ""
    with open(fd, "rb") as file:
        info = os.fstat(fd)
        if info.st_uid != os.getuid():
            return None, f"belongs to uid {info.st_uid}, not to this user"
        if info.st_mode & 0o022:
            return None, f"may be written by others (mode {stat.filemode(info.st_mode)})"
        try:
            return file.read(64).decode().strip() or None, ""
        except UnicodeDecodeError:
            return None, ""
