"""File helpers every layer uses: the writable-folder check, files replaced atomically
(JSON among them), JSON lines, sha256, a private folder. Standard library only.

A run folder sits in a project folder its group may write, so every file written there
is one a neighbour could have prepared a trap for: a temporary is created by mkstemp
beside its target (O_CREAT|O_EXCL|O_NOFOLLOW, a name no one can predict, mode 0600 until
fchmod'ed through its descriptor), an appended file is opened without following a link,
and what is checked is the open descriptor (fstat), never the path a second time.

The JSON written here is strict JSON that any reader takes: a NaN or infinite number (a
diverged loss) is written as null, never as the `NaN`/`Infinity` Python would write.
"""

from __future__ import annotations

import errno
import hashlib
import json
import math
import os
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from workload.held import is_held


def path_kind(path: Path) -> str:
    """What is at `path`, in words (a dangling link is named with its target)."""
    if path.is_symlink() and not path.exists():
        return f"a symbolic link to {os.readlink(path)}, which does not exist"
    return mode_kind(path.stat().st_mode)


def mode_kind(mode: int) -> str:
    """The kind of file a stat mode says, in words (an lstat's a link too)."""
    kinds = ((stat.S_ISDIR, "a folder"), (stat.S_ISREG, "a file"), (stat.S_ISFIFO, "a FIFO"),
             (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
             (stat.S_ISSOCK, "a socket"), (stat.S_ISLNK, "a symbolic link"))
    return next((name for test, name in kinds if test(mode)), "a special file")


def open_regular(path: str | Path, follow_links: bool = True) -> int:
    """A read-only descriptor of the regular file `path` (a link to one followed unless
    `follow_links` is false: a file in a folder others may write), or OSError naming what
    else it is: opened without waiting (a FIFO's open waits for a writer) and checked on
    the descriptor, so a swap after a check cannot slip in."""
    nofollow = 0 if follow_links else os.O_NOFOLLOW
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | nofollow)
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise OSError(errno.EINVAL, f"{path} is {mode_kind(mode)}, not a file")
    os.set_blocking(fd, True)
    return fd


def regular_file_problem(path: str | Path) -> str | None:
    """None when `path` is a regular file (a link to one included), else what it is: read
    before any check, a FIFO waits for a writer and /dev/zero never ends."""
    file = Path(path).expanduser()
    if file.is_file():
        return None
    if not os.path.lexists(file):
        return f"{file} does not exist"
    return f"{file} is {path_kind(file)}, not a file"


def unwritable_reason(path: str | Path, create: bool = False) -> str | None:
    """None when a file can be created in `path`, else why.

    `create` makes the folder (and its parents) first; without it the nearest existing
    parent is tested. A real file is created and removed: os.access() says yes on read-only
    bind mounts.
    """
    folder = Path(path).expanduser().absolute()
    if os.path.lexists(folder) and not folder.is_dir():  # else mkdir says "File exists"
        return f"{folder} is {path_kind(folder)}, not a folder"
    try:
        if create:
            folder.mkdir(parents=True, exist_ok=True)
        while not folder.exists() and folder != folder.parent:
            folder = folder.parent
        if not folder.is_dir():
            return f"{folder} is not a folder"
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".write-test-"):
            return None
    except OSError as error:
        return f"{folder}: {error.strerror}"


def output_file_problem(path: str | Path) -> str | None:
    """None when a command can write its output file at `path` (a --json PATH) after its
    work, else why: checked before the work, so an hour's results are not lost to a
    folder, a FIFO (an open() that waits for a reader) or a device in the way."""
    file = Path(path).expanduser()
    if file.is_dir():
        return f"{file} is a folder"
    if file.exists() and not file.is_file():
        return f"{file} is not a regular file"
    return unwritable_reason(file.parent, create=False)


def write_json(path: Path, data: dict) -> None:
    """Write through a temporary file and rename, so readers never see half a file."""
    replace_file(path, (json_text(data, indent=2) + "\n").encode())


def umask_mode(full: int = 0o666) -> int:
    """The mode open() gives a new file (mkdir a folder, with `full` 0o777): `full` less
    the umask, so the group sharing a run reads what the user's umask lets it."""
    mask = os.umask(0)  # reading the umask means setting it: put it back at once
    os.umask(mask)
    return full & ~mask


def set_mode(fd: int, mode: int) -> None:
    """fchmod `fd` to `mode`, where the file system keeps modes: one without them (FAT,
    some FUSE and object-store mounts) refuses the call, and its files have the mode the
    mount gives every file."""
    try:
        os.fchmod(fd, mode)
    except OSError as error:
        if error.errno not in (errno.ENOSYS, errno.EOPNOTSUPP, errno.EPERM):
            raise


def open_to_group(folder: Path) -> None:
    """A folder made private (0700) while it was written gets the mode mkdir would have
    given it (the setgid bit kept), set through a descriptor opened without following a
    link (or through the descriptor a held path names): in a folder others may write, no
    one could put a link in it meanwhile for a writer to follow."""
    nofollow = 0 if is_held(folder) else os.O_NOFOLLOW
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | nofollow | os.O_CLOEXEC)
    try:
        set_mode(fd, umask_mode(0o777) | (os.fstat(fd).st_mode & stat.S_ISGID))
    finally:
        os.close(fd)


@contextmanager
def replacing(path: Path, mode: int | None = None, durable: bool = False) -> Iterator:
    """A binary file to write `path`'s new content into: a private temporary beside it
    (mkstemp), given `mode` (default: umask_mode()) through its descriptor, fsynced when
    `durable`, then renamed over `path`; removed when the write fails. A link or file a
    neighbour put at any name is neither followed nor overwritten."""
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.tmp-")
    try:
        with os.fdopen(fd, "wb") as file:
            yield file
            file.flush()
            set_mode(fd, umask_mode() if mode is None else mode)
            if durable:
                os.fsync(fd)
        os.replace(name, path)
    except BaseException as error:
        Path(name).unlink(missing_ok=True)
        if isinstance(error, OSError) and error.filename is None:
            error.filename = str(path)  # a write's error names no file: the line names it
        raise


def replace_file(path: Path, data: bytes, mode: int | None = None,
                 durable: bool = False) -> None:
    """`path` holds `data`, whole, as one rename (replacing())."""
    with replacing(path, mode, durable) as file:
        file.write(data)


def create_new(path: Path, mode: int = 0o666) -> int:
    """A descriptor for writing a file that did not exist: FileExistsError for anything
    at `path` (a link a neighbour planted included), never a file reached through it."""
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                   mode)


def open_append(path: Path, buffering: int = -1, binary: bool = False):
    """`path` opened to append text (bytes when `binary`; created when missing), never
    through a link, and only when it is a regular file (a FIFO would wait for a reader):
    OSError otherwise."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK
                 | os.O_CLOEXEC, 0o666)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, f"{path} is not a regular file")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "ab" if binary else "a", buffering=buffering)


def private_folder_problem(path: Path, close_looser: bool = True,
                           readable: bool = False) -> str | None:
    """None when `path` is a folder of this user's that only this user can enter (made,
    mode 0700, when missing), else why not: a symbolic link or a folder of another uid,
    which someone else could fill. A looser mode of the user's own folder is closed, or,
    without `close_looser`, refused when others may write it (they may have filled it).
    `readable`: the group and others keep what the umask lets them read and enter (a
    folder a library writes into by path, which the group may read), never write."""
    mode = umask_mode(0o777) & ~0o022 if readable else 0o700
    try:
        os.mkdir(path, mode)
    except FileExistsError:
        pass
    except OSError as error:
        return f"{path} cannot be created ({error.strerror})"
    try:  # opened without following a link, so what is checked is what is used
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError as error:  # a link gives ELOOP or (with O_DIRECTORY) ENOTDIR
        if os.path.islink(path):
            return f"{path} is a symbolic link"
        kind = {errno.ENOTDIR: "is not a folder"}
        return f"{path} {kind.get(error.errno, f'cannot be opened ({error.strerror})')}"
    try:
        info = os.fstat(fd)
        if info.st_uid != os.getuid():
            return f"{path} belongs to uid {info.st_uid}, not to this user (uid {os.getuid()})"
        if info.st_mode & 0o022 and not close_looser:
            return (f"{path} may be written by others (mode {stat.filemode(info.st_mode)}), "
                    "who may have put files there")
        os.fchmod(fd, mode)
    finally:
        os.close(fd)
    return unwritable_reason(path)


def json_text(data, indent: int | None = None) -> str:
    """Strict JSON: non-finite floats become null."""
    return json.dumps(finite_or_null(data), indent=indent, sort_keys=True, allow_nan=False)


def finite_or_null(value):
    """`value` with every NaN or infinite float (in dicts, lists, tuples) replaced by None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite_or_null(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_or_null(v) for v in value]
    return value


def strict_json(text: str):
    """JSON as a file from disk must be: no NaN or Infinity, no number that becomes
    infinite as a float (`1e400`), and no nesting past Python's recursion limit (where
    json raises RecursionError), each refused with ValueError naming it."""
    try:
        return json.loads(text, parse_constant=_refuse_constant, parse_float=_finite_float)
    except RecursionError:
        raise ValueError("it is nested too deeply to be data") from None


def read_json_file(path: Path, limit: int | None = None):
    """strict_json of a regular file's UTF-8 text (read_regular: at most `limit` bytes).
    OSError when it cannot be read, is not a regular file (a FIFO would wait for a writer
    forever) or is larger, ValueError when it is not UTF-8 or not strict JSON."""
    return strict_json(read_regular(path, limit).decode("utf-8"))


def read_regular(path: Path, limit: int | None = None, follow_links: bool = True) -> bytes:
    """The bytes of the regular file `path` (open_regular). OSError naming it when it is
    something else (never opened: a FIFO waits for a writer, /dev/zero never ends) or
    holds more than `limit` bytes (checked on the open file, before reading)."""
    if follow_links and (problem := regular_file_problem(path)):
        raise OSError(errno.EINVAL, problem)
    with open(open_regular(path, follow_links), "rb") as file:
        if limit is None:
            return file.read()
        size = os.fstat(file.fileno()).st_size
        data = file.read(limit + 1) if size <= limit else b""
    if size > limit or len(data) > limit:  # a file that grew since is refused too
        raise OSError(errno.EFBIG, f"{path} holds {max(size, len(data))} bytes, more "
                                   f"than the {limit} such a file may have")
    return data


def _refuse_constant(word: str):
    raise ValueError(f"{word} is not JSON")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"the number {text[:40]} is beyond a float's range")
    return value


def append_jsonl(path: Path, record: dict) -> None:
    with open_append(path) as f:
        f.write(json_text(record) + "\n")


def read_jsonl_lines(path: Path, limit: int | None = None, follow_links: bool = True
                     ) -> list[tuple[int, dict | None, str]]:
    """Each line of a JSON-lines file that is not blank: (its number, its record, "") or
    (its number, None, why it is left out): a last line without its newline (a torn
    write: a full disk, a node that died), a line that is not UTF-8, not strict JSON
    (strict_json) or not an object. OSError as read_regular (at most `limit` bytes;
    a link not followed without `follow_links`)."""
    lines = read_regular(path, limit, follow_links).split(b"\n")
    found = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        if number == len(lines):  # after the last newline: an unterminated line
            found.append((number, None, "no newline at its end (a torn write)"))
            continue
        try:
            record = strict_json(line.decode("utf-8"))
        except ValueError:  # UnicodeDecodeError is one
            record = None
        found.append((number, record, "") if isinstance(record, dict)
                     else (number, None, "not a JSON object"))
    return found


def read_jsonl_records(path: Path, limit: int | None = None, follow_links: bool = True
                       ) -> tuple[list[dict], list[str]]:
    """The records of a JSON-lines file and a description of each line left out
    (read_jsonl_lines)."""
    found = read_jsonl_lines(path, limit, follow_links)
    return ([record for _, record, _ in found if record is not None],
            [f"line {number}: {why}" for number, _, why in found if why])


def proc_stat_fields(pid: int | str = "self") -> list[str] | None:
    """The fields of /proc/PID/stat after the process's name (stat(5)'s field 3 is [0]),
    or None when the process is gone or /proc does not say. Split after the last ")":
    the name in brackets may hold spaces and brackets."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def sha256_file(path: Path) -> str:
    """The sha256 of a regular file (open_regular: anything else is an OSError)."""
    digest = hashlib.sha256()
    with open(open_regular(path), "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()



def swappable_parent(folder: Path) -> str | None:
    """Why others could rename `folder`, or a folder above it, and put theirs in its place:
    the first of them that others may write without the sticky bit /tmp has (None: none)."""
    for path in [folder, *folder.parents]:
        try:
            mode = os.stat(path).st_mode
        except OSError:
            continue
        if mode & 0o022 and not mode & stat.S_ISVTX:
            return (f"{path} may be written by others (mode {stat.filemode(mode)}) without "
                    "the sticky bit, so they could swap what is written in it for their own")
    return None


def shared_sticky(folder: Path) -> bool:
    """Whether others may write `folder` under the sticky bit (a node's /tmp): what they
    put there stays theirs, but any name may be theirs."""
    mode = os.stat(folder).st_mode
    return bool(mode & 0o022 and mode & stat.S_ISVTX)
