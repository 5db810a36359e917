"""Who uses a staging: a shared flock(2) on `DIR/.<staging>.lock`, held by each job's
stager for the job's life (the kernel drops it when the process ends, however it ends, so
there are no stale leases to clean). Removing a staging takes the lock exclusively without
waiting: if any job holds it, the staging stays.

A lock file is unlinked by the process that removes its staging, so a process that opened
it just before checks, once it holds the lock, that the name still leads to the file it
locked, and opens the new one otherwise. On a file system without flock (Lustre mounted
without `-o flock`, some NFS) nothing can tell whether a staging is in use: no staging is
removed there but a damaged one of the job's own source state.
"""

from __future__ import annotations

import errno
import fcntl
import os
import shutil
from pathlib import Path


NO_LOCKS = {errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP}


class NoLocks(OSError):
    """The file system of the staging folder has no flock."""


def lock_path(target: Path) -> Path:
    return target.with_name(f".{target.name}.lock")


def _open_locked(path: Path, how: int) -> int | None:
    """An open file descriptor of `path` locked `how`, or None if another process holds a
    conflicting lock (with LOCK_NB)."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, how)
        except BlockingIOError:
            os.close(fd)
            return None
        except OSError as error:
            os.close(fd)
            raise NoLocks(*error.args) if error.errno in NO_LOCKS else error from None
        try:
            if os.fstat(fd).st_ino == os.stat(path).st_ino:
                return fd
        except FileNotFoundError:
            pass
        os.close(fd)  # removed meanwhile: lock the file that is there now


def hold_shared(path: Path) -> int | None:
    """Say that this process uses the staging: the descriptor stays open until it ends
    (None where the file system has no locks)."""
    try:
        return _open_locked(path, fcntl.LOCK_SH)
    except NoLocks:
        return None


def remove_if_unused(target: Path, mine: int | None = None) -> bool:
    """Remove the staging `target` and its manifest unless another process holds its lock;
    whether it was removed. `mine`: this process's own shared lock of it, made exclusive
    for the removal and shared again after it."""
    lock = lock_path(target)
    if mine is None:
        fd = _open_locked(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    else:
        fd = mine if _upgrade(mine) else None
    if fd is None:
        return False
    shutil.rmtree(target, ignore_errors=True)
    target.with_name(target.name + ".manifest.json").unlink(missing_ok=True)
    if mine is not None:
        fcntl.flock(mine, fcntl.LOCK_SH)
    else:
        lock.unlink(missing_ok=True)
        os.close(fd)
    return True


def _upgrade(fd: int) -> bool:
    """Make a shared lock exclusive if no other process holds one; a failed conversion
    drops the lock on Linux (flock(2)), so it is taken shared again."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        fcntl.flock(fd, fcntl.LOCK_SH)
        return False


def let_go(target: Path, mine: int) -> None:
    """This process gives up `target` (its staging failed or stopped): the lock file goes
    too unless the staging exists or another process holds it."""
    if mine is None:
        return
    if not os.path.lexists(target) and _upgrade(mine):
        lock_path(target).unlink(missing_ok=True)
    os.close(mine)
