"""Folders reached once, then through a descriptor: the other half of the safe writes
(workload.files has the files). Standard library only.

A folder inside one that others may write without the sticky bit (a run folder in a
project folder, mode 2775) can be renamed by them and another put at its name: every
later access by path would land in theirs, or through their link in any folder of the
user's. So a folder the package writes into there is opened once, without following a
link, checked on its descriptor, and reached from then on through that descriptor: a
"held path", /proc/PID/fd/N, which the kernel resolves through the descriptor and never
through the folder's names (this process, its writer process and a library that wants a
path all use it). Renamed, it is renamed by finding its own inode in its parent.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from workload.usage import UsageError

# The end of the line for what was put at the name of a folder this process made or holds.
SOMEONE_ELSE = ": someone else put it there"


def fd_path(fd: int) -> Path:
    """The path by which this process (and only it, or a process it hands the path to)
    reaches what its descriptor `fd` holds, whatever is renamed or unlinked meanwhile."""
    return Path(f"/proc/{os.getpid()}/fd/{fd}")


def held_path(fd: int) -> Path:
    """The path that reaches the folder `fd` holds, whatever is renamed meanwhile; a
    UsageError where /proc is not mounted (a chroot, `apptainer exec --no-mount proc`),
    which would otherwise surface as a traceback at the first file written below it."""
    path = fd_path(fd)
    if not os.path.isdir(path):
        raise UsageError(f"{path} does not reach the folder this process opened: /proc is "
                         "not mounted here, and the package reaches the folders it writes "
                         "through /proc/PID/fd; run it with /proc mounted (every container "
                         "runtime mounts it unless told not to, e.g. apptainer's --no-mount "
                         "proc; in a chroot: mount -t proc proc /proc)")
    return path


# A held path inside a line of text: /proc/PID/fd/N, then a name below it or the end.
_HELD_IN_TEXT = re.compile(r"/proc/\d+/fd/\d+(?=/|\b)")


def named_for_the_user(text: str) -> str:
    """`text` (a line naming files) with each held path's /proc/PID/fd/N replaced by where
    its folder is now (the kernel's name for the descriptor): a user reads their own
    folders' names, never a descriptor's, which means nothing once the process has ended.
    One whose descriptor is gone, or no longer a folder, stays as it is. train names its
    own run folder as the user gave it first (workload.logs.messages_rewritten with
    RunFolder.said); this names every other held folder, in every command's lines."""
    def where(match: re.Match) -> str:
        try:
            folder = os.readlink(match.group(0))
        except OSError:
            return match.group(0)
        return folder if folder.startswith("/") and os.path.isdir(folder) else match.group(0)
    return _HELD_IN_TEXT.sub(where, text)


def is_held(path: str | Path) -> bool:
    parts = Path(path).parts
    return len(parts) == 5 and parts[:2] == ("/", "proc") and parts[3] == "fd"


def hold_folder(path: Path, private: bool = True) -> int:
    """A descriptor of the folder `path`, opened without following a link at its name and
    checked on the descriptor: this user's, and (`private`) mode 0700. OSError naming what
    else it is (someone else's folder, a link, a file)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as error:
        if error.errno in (errno.ELOOP, errno.ENOTDIR):
            kind = "a symbolic link" if os.path.islink(path) else "not a folder"
            raise OSError(error.errno, f"{path} is {kind}, not a folder of this run") from None
        raise
    return _checked(fd, path, private)


def _checked(fd: int, path: Path, private: bool) -> int:
    """`fd` when the folder it holds is this user's (and, `private`, mode 0700); else it
    is closed, and OSError names `path` and what it is."""
    info = os.fstat(fd)
    why = (f"belongs to uid {info.st_uid}, not to this user (uid {os.getuid()})"
           if info.st_uid != os.getuid() else
           f"has mode {stat.filemode(info.st_mode)}, not 0700" if private
           and stat.S_IMODE(info.st_mode) & 0o077 else None)
    if why:
        os.close(fd)
        raise OSError(errno.EPERM, f"{path} {why}{SOMEONE_ELSE}")
    return fd


def hold_by_inode(parent: Path, inode: int) -> Path:
    """The held path of the private folder (hold_folder's checks) in `parent` whose inode
    is `inode`, found by it whatever its name is now: another process's held folder (an
    FSDP rank's view of rank 0's save folder), which a neighbour may have renamed, or
    swapped for their own or a link. Only the inode is compared with the other process's:
    st_dev is a node's own number for a network file system's mount (it differs between
    nodes); the device is `parent`'s, as this process sees it. OSError when no folder
    there is that one, or it is not this user's private folder."""
    nofollow = 0 if is_held(parent) else os.O_NOFOLLOW
    fd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | nofollow | os.O_CLOEXEC)
    try:
        device = os.fstat(fd).st_dev
        name = _name_of(fd, inode, device)
        if name is None:
            raise _renamed_away(parent)
        found = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                        dir_fd=fd)
    finally:
        os.close(fd)
    info = os.fstat(found)
    if (info.st_ino, info.st_dev) != (inode, device):  # swapped since it was found
        os.close(found)
        raise _renamed_away(parent)
    return held_path(_checked(found, parent / name, private=True))


def hold_own_folder(path: Path, mode: int) -> int:
    """hold_folder of `path` (made when missing), which gets `mode` through its
    descriptor: a folder a library writes into by path, which no one else may write."""
    try:
        os.mkdir(path, mode)
    except FileExistsError:
        pass
    fd = hold_folder(path, private=False)
    try:
        os.fchmod(fd, mode)
    except OSError:
        os.close(fd)
        raise
    return fd


@contextmanager
def holding(folder: Path) -> Iterator[Path]:
    """The held path of `folder` (a link at its name refused: OSError) while the block
    runs: what is done under it stays in the folder opened at its start, whatever is
    renamed meanwhile."""
    nofollow = 0 if is_held(folder) else os.O_NOFOLLOW
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | nofollow | os.O_CLOEXEC)
    try:
        yield held_path(fd)
    finally:
        os.close(fd)


def make_held(path: Path) -> Path:
    """A new private folder (0700) at `path`, held (hold_folder): its held path. The
    descriptor stays open for this process's life unless `let_go` closes it. Whatever is
    at `path` by the time it is opened (a link, a file, another user's folder) was put
    there by someone else in the instant after the mkdir: the OSError says so."""
    os.mkdir(path, 0o700)
    try:
        return held_path(hold_folder(path))
    except OSError as error:
        if error.errno not in (errno.ELOOP, errno.ENOTDIR):  # (EPERM says it already)
            raise
        raise OSError(error.errno, f"{error.strerror}{SOMEONE_ELSE}") from None


def let_go(held: Path) -> None:
    """Close the descriptor behind this process's held path `held`."""
    if is_held(held) and held.parts[2] == str(os.getpid()):
        os.close(int(held.name))


def held_name(held: Path, parent: Path) -> tuple[int, str]:
    """A descriptor of `parent` (opened without following a link at its name) and the name
    in it of the folder `held` reaches; OSError when no name there leads to it (renamed
    away by someone else: never a folder put in its place)."""
    target = os.stat(held)
    nofollow = 0 if is_held(parent) else os.O_NOFOLLOW
    fd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | nofollow | os.O_CLOEXEC)
    try:
        name = _name_of(fd, target.st_ino, target.st_dev)
    except BaseException:
        os.close(fd)
        raise
    if name is None:
        os.close(fd)
        raise _renamed_away(parent)
    return fd, name


def _name_of(fd: int, inode: int, device: int) -> str | None:
    """The name in the folder `fd` of its entry (device, inode); None when none is."""
    with os.scandir(fd) as entries:
        for entry in entries:  # stat, not the listing's d_ino (overlayfs differs)
            try:
                found = entry.stat(follow_symlinks=False)
            except FileNotFoundError:  # removed since the listing
                continue
            if (found.st_ino, found.st_dev) == (inode, device):
                return entry.name
    return None


def _renamed_away(parent: Path) -> OSError:
    return OSError(errno.ENOENT, f"the folder being written in {parent} was renamed away "
                                 "by someone else meanwhile; nothing was put in its place")


def rename_held(held: Path, final: Path) -> None:
    """The folder `held` (a held path, or a plain one) renamed to `final` in final's
    parent (os.replace's rules), by its own name there."""
    if not is_held(held):
        os.replace(held, final)
        return
    fd, name = held_name(held, final.parent)
    try:
        os.replace(name, final.name, src_dir_fd=fd, dst_dir_fd=fd)
    finally:
        os.close(fd)


def remove_held(held: Path, parent: Path) -> None:
    """The folder `held` (held path or plain) and what it holds removed, quietly: never a
    folder put at its name meanwhile, never through a link."""
    if not is_held(held):
        shutil.rmtree(held, ignore_errors=True)
        return
    try:
        fd, name = held_name(held, parent)
    except OSError:
        return
    try:
        shutil.rmtree(name, dir_fd=fd, ignore_errors=True)
    finally:
        os.close(fd)


def remove_in(folder: Path, names: list[str]) -> None:
    """The entries `names` of `folder` removed (a folder with what it holds), each by
    its name in `folder` opened once without following a link at its name: a link at an
    entry's name is removed itself, never followed, and a `folder` renamed away
    meanwhile and replaced is never the one emptied. OSError when `folder` is a link."""
    nofollow = 0 if is_held(folder) else os.O_NOFOLLOW
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | nofollow | os.O_CLOEXEC)
    try:
        for name in names:
            if stat.S_ISDIR(os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode):
                shutil.rmtree(name, dir_fd=fd)
            else:
                os.unlink(name, dir_fd=fd)
    finally:
        os.close(fd)
