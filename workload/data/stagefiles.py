"""The files of `--stage-to`: what a source holds, what identifies it, the copy of a folder,
the unpacking of a tar, and the lock files that say which jobs use a staging.

A source folder is walked as the image reader walks it (links followed, a folder reached
twice refused before anything is copied: see datasets.walk_once). Copying and unpacking
look at the preemption flag between files (and between chunks of a large file), so a
signal stops them within moments; the caller removes the partial copy.

Who uses a staging: a shared flock(2) on `DIR/.<staging>.lock`, held by each job's
stager for the job's life (the kernel drops it when the process ends, however it ends, so
there are no stale leases to clean). Removing a staging takes the lock exclusively without
waiting: if any job holds it, the staging stays.

A copy is made in a private partial folder beside the staging (`.<staging>.partial-*`),
which its stager removes when the copy stops or fails; one whose stager ended without
unwinding (SIGKILL after SLURM's grace time, a lost node) is removed by the next stager
of the same staging once it holds the lock alone, and with an older staging.

A lock file is unlinked by the process that removes its staging, so a process that opened
it just before checks, once it holds the lock, that the name still leads to the file it
locked, and opens the new one otherwise. On a file system without flock (Lustre mounted
without `-o flock`, some NFS) nothing can tell whether a staging is in use: no staging is
removed there but a damaged one of the job's own source state.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import shutil
import stat
import tarfile
from pathlib import Path
from typing import BinaryIO

from workload.config import TAR_SUFFIXES
from workload.data.datasets import walk_once
from workload.errors import UsageError
from workload.files import create_new, mode_kind, open_regular
from workload.launch.preemption import PreemptionFlag

CHUNK = 8 << 20  # bytes copied between two looks at the preemption flag


class StagingStopped(Exception):
    """A preemption signal came while staging."""

    def __init__(self, signal_name: str):
        super().__init__(f"staging stopped by {signal_name}")
        self.signal_name = signal_name


def stop_if_signalled(flag: PreemptionFlag | None) -> None:
    if flag is not None and flag.is_set():
        raise StagingStopped(flag.signal_name)


def scan(folder: Path, flag: PreemptionFlag | None = None
         ) -> tuple[list[str], dict[str, os.stat_result]]:
    """The folders and the regular files under `folder` (relative paths), links followed."""
    folders = []
    files = {}
    for parent, _, names in walk_once(str(folder)):
        stop_if_signalled(flag)  # a million files on a busy shared file system take a while
        relative = Path(parent).relative_to(folder)
        folders.append(str(relative))
        for name in names:
            info = (Path(parent) / name).stat()
            if stat.S_ISREG(info.st_mode):  # a FIFO or a device is no data file
                files[str(relative / name)] = info
    return folders, files


def named(folder: Path, names: list[str], flag: PreemptionFlag | None = None
          ) -> dict[str, os.stat_result]:
    """The files `names` of `folder`, found without listing it (a shard folder's manifest
    names its files: a listing of the folder would add a writer's partial files)."""
    files = {}
    for name in names:
        stop_if_signalled(flag)
        info = (folder / name).stat()
        if not stat.S_ISREG(info.st_mode):
            raise UsageError(f"{folder / name} is not a regular file, and its folder's "
                             "manifest names it as one; write the shards again")
        files[name] = info
    return files


def source_files(source: Path, names: list[str] | None = None,
                 flag: PreemptionFlag | None = None
                 ) -> tuple[list[str], dict[str, os.stat_result]]:
    """The folders and files of a source folder: all of them, or only `names`."""
    if names is None:
        return scan(source, flag)
    return ["."], named(source, names, flag)


def listing(folder: Path) -> dict[str, int]:
    """Every regular file under `folder`: relative path -> size."""
    return {name: info.st_size for name, info in scan(folder)[1].items()}


def identity(source: Path, flag: PreemptionFlag | None = None,
             names: list[str] | None = None) -> str:
    """What tells one state of the source from another, without reading its contents: the
    path, and of the tar or of every file (or of the files `names`) the size, mtime and
    ctime in nanoseconds. ctime catches a rewrite that kept the size and put the old
    mtime back (cp -p, rsync -t): no program can set it."""
    if source.is_file():
        stats = {"": source.stat()}
    else:
        stats = source_files(source, names, flag)[1]
    digest = hashlib.sha256(str(source).encode())
    for name in sorted(stats):
        info = stats[name]
        digest.update(f"\0{name}\0{info.st_size} {info.st_mtime_ns} {info.st_ctime_ns}".encode())
    return digest.hexdigest()


def first_difference(expected: dict[str, int], found: dict[str, int]) -> str | None:
    for name, size in expected.items():
        if found.get(name) != size:
            got = "missing" if name not in found else f"{found[name]} bytes"
            return f"{name}: {got}, expected {size} bytes"
    return None


def copy_in(source: Path, partial: Path, flag: PreemptionFlag | None,
            names: list[str] | None = None) -> dict[str, int]:
    """Copy or unpack `source` into the new folder `partial` (of a folder, only the files
    `names` if given); the files it holds (path -> size)."""
    if source.is_dir():
        return copy_folder(source, partial, flag, names)
    return unpack_tar(source, partial, flag)


def copy_folder(source: Path, partial: Path, flag: PreemptionFlag | None,
                names: list[str] | None = None) -> dict[str, int]:
    folders, files = source_files(source, names, flag)
    for folder in folders:  # empty class folders too: the reader counts them as classes
        (partial / folder).mkdir(parents=True, exist_ok=True)
    for name in sorted(files):
        copy_file(source / name, partial / name, flag)
    return {name: info.st_size for name, info in files.items()}


def copy_file(source: Path, target: Path, flag: PreemptionFlag | None) -> None:
    # open_regular: the file scanned may have been swapped for a FIFO since.
    with open(open_regular(source), "rb") as reader:
        write_new(reader, target, flag)


def write_new(reader: BinaryIO, target: Path, flag: PreemptionFlag | None) -> None:
    """`reader`'s bytes into the new file `target`, a look at the flag between chunks."""
    with os.fdopen(create_new(target), "wb") as writer:
        while True:
            stop_if_signalled(flag)
            chunk = reader.read(CHUNK)
            if not chunk:
                return
            writer.write(chunk)


def unpack_tar(source: Path, partial: Path, flag: PreemptionFlag | None) -> dict[str, int]:
    """Unpack the folders and regular files of the tar `source` into `partial`, each made
    new (never through a link, never over a file). tarfile's own extraction does not serve:
    its filters (PEP 706) that keep a member inside the folder are missing before Python
    3.10.12 and 3.11.4 (Debian 12's python3 is 3.11.2), and an image folder needs no links."""
    try:
        with tarfile.open(source) as tar:
            files = {}
            for member in tar:  # one member at a time: a .tar.gz is read once
                stop_if_signalled(flag)
                name = safe_name(source, member)
                if member.isdir():
                    (partial / name).mkdir(parents=True, exist_ok=True)
                    continue
                (partial / name).parent.mkdir(parents=True, exist_ok=True)
                with tar.extractfile(member) as reader:
                    write_new(reader, partial / name, flag)
                files[name] = member.size
            return files
    except tarfile.TarError as error:
        reason = str(error).splitlines()[0].rstrip(":")
        raise UsageError(f"{source} is not a readable tar file ({reason}); pack the image "
                         "folder with: tar -cf NAME.tar -C PARENT NAME") from None
    except (FileExistsError, NotADirectoryError):  # a name made twice, or under a file
        raise UsageError(f"{source} holds {member.name!r} twice, or as a file and a folder; "
                         "nothing was staged from it: pack the image folder again with: "
                         "tar -cf NAME.tar -C PARENT NAME") from None


def safe_name(source: Path, member: tarfile.TarInfo) -> str:
    """The member's name, relative, if it is a folder or a regular file that unpacks inside
    the staging folder; one line why not otherwise."""
    if member.name.startswith("/") or ".." in Path(member.name).parts:
        why = f"{member.name!r} is an absolute path or leads out with '..'"
    elif not (member.isdir() or member.isfile()):
        why = (f"{member.name!r} is a link or a special file; only folders and regular "
               "files are unpacked")
    else:
        return str(Path(member.name))
    raise UsageError(f"{source} holds a member with an unsafe name or link ({why}); "
                     "nothing was unpacked from it: pack the folder again with relative "
                     "names, as: tar -cf NAME.tar -C PARENT NAME")


def staged_name(source: Path) -> str:
    name = source.name
    for suffix in TAR_SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


# ---------------------------------------------------------------- who uses a staging
NO_LOCKS = {errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP}


class NoLocks(OSError):
    """The file system of the staging folder has no flock."""


def lock_path(target: Path) -> Path:
    return target.with_name(f".{target.name}.lock")


def _open_locked(path: Path, how: int) -> int | None:
    """An open file descriptor of `path` locked `how`, or None if another process holds a
    conflicting lock (with LOCK_NB)."""
    while True:
        fd = _open_lock_file(path)
        try:
            fcntl.flock(fd, how)
        except BlockingIOError:
            os.close(fd)
            return None
        except OSError as error:
            os.close(fd)
            raise NoLocks(*error.args) if error.errno in NO_LOCKS else error from None
        try:
            if _same_file(os.fstat(fd), os.stat(path, follow_symlinks=False)):
                return fd
        except FileNotFoundError:
            pass
        os.close(fd)  # removed meanwhile: lock the file that is there now


def _same_file(one: os.stat_result, other: os.stat_result) -> bool:
    return (one.st_dev, one.st_ino) == (other.st_dev, other.st_ino)


def _open_lock_file(path: Path) -> int:
    """`path` opened (made when missing) to be locked: never through a link and only when
    it is a regular file (checked on the descriptor), since the folder may be shared and
    someone else may have put anything at its name; one line otherwise."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK
                     | os.O_CLOEXEC, 0o666)
    except OSError as error:
        if error.errno != errno.ELOOP:
            raise
        what = "a symbolic link"
    else:
        mode = os.fstat(fd).st_mode
        if stat.S_ISREG(mode):
            return fd
        os.close(fd)
        what = mode_kind(mode)
    raise UsageError(f"{path} is {what}, where train keeps a lock file; someone else put it "
                     f"there: move it away (mv {path} {path}.moved), or pass another folder")


def hold_shared(path: Path) -> int | None:
    """Say that this process uses the staging: the descriptor stays open until it ends
    (None where the file system has no locks)."""
    try:
        return _open_locked(path, fcntl.LOCK_SH)
    except NoLocks:
        return None


def try_exclusive(path: Path) -> int | None:
    """An open descriptor of `path` locked exclusively, or None if another process holds
    it (NoLocks where the file system has no flock)."""
    return _open_locked(path, fcntl.LOCK_EX | fcntl.LOCK_NB)


def remove_if_unused(target: Path, mine: int | None = None) -> bool:
    """Remove the staging `target`, its manifest and any partial copy of it unless another
    process holds its lock; whether it was removed. `mine`: this process's own shared
    lock of it, made exclusive for the removal and shared again after it."""
    lock = lock_path(target)
    if mine is None:
        fd = _open_locked(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    else:
        fd = mine if _upgrade(mine) else None
    if fd is None:
        return False
    shutil.rmtree(target, ignore_errors=True)
    target.with_name(target.name + ".manifest.json").unlink(missing_ok=True)
    _remove_partials(target)
    if mine is not None:
        fcntl.flock(mine, fcntl.LOCK_SH)
    else:
        lock.unlink(missing_ok=True)
        os.close(fd)
    return True


def partial_prefix(target: Path) -> str:
    """The start of the name of a partial copy of `target` (the stager's mkdtemp prefix)."""
    return f".{target.name}.partial-"


def remove_dead_partials(target: Path, mine: int | None) -> list[str]:
    """The partial copies of `target` left by stagers that ended without unwinding,
    removed while no other process holds its lock (`mine`, this process's shared lock,
    made exclusive meanwhile): only a live stager of it can be writing one. Their names;
    none where another job holds it or there are no file locks to tell."""
    if mine is None or not _upgrade(mine):
        return []
    try:
        return _remove_partials(target)
    finally:
        fcntl.flock(mine, fcntl.LOCK_SH)


def _remove_partials(target: Path) -> list[str]:
    removed = []
    for entry in os.scandir(target.parent):
        if entry.name.startswith(partial_prefix(target)) and entry.is_dir(
                follow_symlinks=False):
            shutil.rmtree(entry.path, ignore_errors=True)
            removed.append(entry.name)
    return sorted(removed)


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
