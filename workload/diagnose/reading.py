"""What a diagnostics folder holds, read without trusting it: only regular files inside
the folder (no link followed, no FIFO or device opened for reading), only a bounded part
of each, every field's type checked, every string escaped and shortened before it can be
printed. A file that fails is named in one line and left out; the others still count.

The folder may be another user's (diagnosing their job as root, or a shared project
folder), and a hung or killed job leaves half-written files: neither may hang diagnose,
make it print what a file points to, or forge its verdict."""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path

from workload.config import MAX_RANKS
from workload.diagnose.records import Skipped, flight, heartbeat, last_dump, shown, startup
from workload.errors import UsageError
from workload.launch.diagnostics import DIAGNOSTICS, FR_PREFIX, STARTUP_PREFIX
from workload.runfolder import RunFolder

# Ranks in plain ASCII digits (re.ASCII: "\d" would take other scripts' digits), as many
# as MAX_RANKS needs, no leading zero.
_RANK_FILE = re.compile(r"(heartbeat-|rank-|fr-rank-|startup-rank-)(0|[1-9][0-9]{0,6})"
                        r"(\.json|\.txt)?", re.ASCII)
HEARTBEAT_BYTES = 64 << 10   # a heartbeat is a few hundred bytes
RECORD_BYTES = 16 << 20      # fr-rank-<N>.json: 100 collectives with their stacks
DUMP_TAIL_BYTES = 256 << 10  # rank-<N>.txt grows with every dump: its end is the latest


@dataclass
class Folder:
    """What the folder holds: per rank, its records; the files left out; torch's dumps."""

    path: Path
    ranks: dict[int, dict] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)
    pickled: list[str] = field(default_factory=list)


def open_folder(run_dir: Path) -> tuple[int, Path]:
    """The diagnostics folder of `run_dir` (or `run_dir` itself when it holds the files),
    opened; a missing one, or a mistyped parent folder, is a usage error."""
    try:
        top = os.open(run_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise UsageError(f"RUN_DIR {shown(run_dir)} cannot be read ({exc.strerror}); pass "
                         "the --output-dir of a train run") from None
    try:
        inner = os.open(DIAGNOSTICS, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW |
                        os.O_CLOEXEC, dir_fd=top)
    except FileNotFoundError:
        if any(_RANK_FILE.fullmatch(name) for name in os.listdir(top)):
            return top, run_dir  # a diagnostics folder itself (a script's ./diagnostics)
        os.close(top)
        raise UsageError(no_folder(run_dir)) from None
    except OSError as exc:
        os.close(top)
        raise UsageError(f"{shown(run_dir / DIAGNOSTICS)} is not a folder diagnose reads "
                         f"({exc.strerror}; a link is not followed)") from None
    os.close(top)
    return inner, run_dir / DIAGNOSTICS


def no_folder(run_dir: Path) -> str:
    """The error for a folder without diagnostics, naming run folders just below it."""
    below = sorted(child.name for child in _children(run_dir)
                   if RunFolder(child).diagnostics.is_dir())
    hint = (f"; run folders inside it: {', '.join(shown(name) for name in below[:3])}"
            if below else "")
    return (f"RUN_DIR {shown(run_dir)} has no {DIAGNOSTICS} folder and no heartbeat-<N>.json, "
            f"rank-<N>.txt or fr-rank-<N>.json: pass the --output-dir of a train run (or "
            f"a script's ./{DIAGNOSTICS}){hint}")


def _children(folder: Path, most: int = 1000) -> list[Path]:
    try:
        with os.scandir(folder) as entries:
            return [Path(e.path) for _, e in zip(range(most), entries)
                    if e.is_dir(follow_symlinks=False)]
    except OSError:
        return []


def read_folder(run_dir: Path) -> Folder:
    """Per rank, what its files say; files left out, and torch's own (pickled) dumps."""
    fd, path = open_folder(run_dir)
    found = Folder(path)
    try:
        for name in sorted(os.listdir(fd)):
            match = _RANK_FILE.fullmatch(name)
            if match:
                read_rank_file(fd, name, match, found)
    finally:
        os.close(fd)
    return found


def read_rank_file(fd: int, name: str, match: re.Match, found: Folder) -> None:
    kind = match.group(1)
    rank = int(match.group(2))
    suffix = match.group(3)
    if rank >= MAX_RANKS:
        found.skipped.append(f"{name}: rank {rank} is not below {MAX_RANKS}")
        return
    readers = {("heartbeat-", ".json"): (HEARTBEAT_BYTES, False, heartbeat),
               ("rank-", ".txt"): (DUMP_TAIL_BYTES, True, last_dump),
               (FR_PREFIX, ".json"): (RECORD_BYTES, False, flight),
               (STARTUP_PREFIX, ".json"): (HEARTBEAT_BYTES, False, startup)}
    if (kind, suffix) == (FR_PREFIX, None):
        found.pickled.append(name)
        return
    if (kind, suffix) not in readers:
        return
    limit, tail, parse = readers[kind, suffix]
    try:
        record = parse(read_bounded(fd, name, limit, tail), rank)
    except Skipped as why:
        found.skipped.append(f"{name}: {why}")
        return
    found.ranks.setdefault(rank, {"rank": rank}).update(record)


def read_bounded(fd: int, name: str, limit: int, tail: bool) -> bytes:
    """The bytes of the regular file `name` in the folder `fd`: all of them (at most
    `limit`), or with `tail` its last `limit`. lstat first, so a FIFO or a device is never
    opened; O_NOFOLLOW and fstat against a swap in between."""
    try:
        _regular(os.stat(name, dir_fd=fd, follow_symlinks=False))
        file = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                       dir_fd=fd)
    except OSError as exc:
        raise Skipped(f"cannot be read ({exc.strerror})") from None
    try:
        size = _regular(os.fstat(file)).st_size
        if size > limit and not tail:
            raise Skipped(f"{size} bytes, more than the {limit} such a file has")
        os.lseek(file, max(0, size - limit), os.SEEK_SET)
        chunks = []
        left = limit
        while left and (chunk := os.read(file, min(left, 1 << 20))):
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    except OSError as exc:
        raise Skipped(f"cannot be read ({exc.strerror})") from None
    finally:
        os.close(file)


def _regular(info: os.stat_result) -> os.stat_result:
    if not stat.S_ISREG(info.st_mode):
        kinds = {stat.S_ISLNK: "a symbolic link", stat.S_ISDIR: "a folder",
                 stat.S_ISFIFO: "a FIFO", stat.S_ISSOCK: "a socket"}
        kind = next((text for test, text in kinds.items() if test(info.st_mode)), "a device")
        raise Skipped(f"{kind}, not a regular file")
    return info
