"""A normal user of the suite's machine, for what users type (the site pages' twins,
tests/twins/twin.py): a passwd entry, as SLURM knows a job's user and its accounts by
it (the neighbours of tests/helpers/neighbour.py need none: no SLURM job of theirs),
switched to with setpriv (root only), running the test environment's Python. The suite's
interpreter may live where only root may go (pyenv's, or CI's environment, in root's
0700 home), while a centre's software is readable by every user: the user is let through
the folders on the way to it, and nothing more (grant_passage)."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import pwd
import shutil
import struct
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from tests.helpers import REPO

# The twins' user: a name a centre could give, an id clear of the neighbours' 6553x.
USER_NAME, USER_ID = "hpcuser", 65520
# useradd takes /etc/passwd's lock and fails on a concurrent one: the suite's workers
# each start a SLURM cluster at once (make test), and each makes sure of the user.
USERADD_LOCK = Path("/run/lock/hpc-train-useradd.lock")


@dataclass(frozen=True)
class User:
    name: str
    uid: int
    gid: int

    def setpriv(self) -> list[str]:
        """What runs a command as this user, with the groups its passwd entry gives."""
        return ["setpriv", f"--reuid={self.uid}", f"--regid={self.gid}", "--init-groups"]

    def own(self, path: Path) -> None:
        os.chown(path, self.uid, self.gid)


def ensure_user(name: str = USER_NAME, uid: int = USER_ID) -> pwd.struct_passwd:
    """The user's passwd entry, made once on this machine (and kept: the next session's
    SLURM accounting holds the same name)."""
    with USERADD_LOCK.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        with contextlib.suppress(KeyError):
            return pwd.getpwnam(name)
        subprocess.run(["useradd", "--uid", str(uid), "--user-group", "--no-create-home",
                        "--home-dir", "/nonexistent", "--shell", "/bin/bash", name],
                       check=True, capture_output=True, text=True, timeout=60)
        return pwd.getpwnam(name)


def reachable(folder: str | Path) -> Path:
    """`folder` made 0755: every user may go through it (mkdtemp makes it 0700)."""
    Path(folder).chmod(0o755)
    return Path(folder)


@contextlib.contextmanager
def reachable_folder(prefix: str):
    """A folder every user can reach (0755, in /var/tmp: pytest's tmp_path is under
    root's 0700 /tmp/pytest-of-root), removed at the end with what users left in it."""
    top = reachable(tempfile.mkdtemp(prefix=prefix, dir="/var/tmp"))
    try:
        yield top
    finally:
        shutil.rmtree(top, ignore_errors=True)


# POSIX ACLs as the kernel takes them (linux/posix_acl_xattr.h): a version, then
# (tag, permissions, id) entries sorted by tag and id.
ACL_XATTR, ACL_VERSION = "system.posix_acl_access", 2
USER_OBJ, USER, GROUP_OBJ, GROUP, MASK, OTHER = 0x01, 0x02, 0x04, 0x08, 0x10, 0x20
NO_ID, PASS = 0xFFFFFFFF, 0o1


def acl_entries(folder: Path) -> list[tuple[int, int, int]]:
    """`folder`'s access ACL: its own entries, else the three its mode bits make."""
    try:
        raw = os.getxattr(folder, ACL_XATTR)
    except OSError as error:
        if error.errno != errno.ENODATA:
            raise
        mode = folder.stat().st_mode
        return [(USER_OBJ, mode >> 6 & 7, NO_ID), (GROUP_OBJ, mode >> 3 & 7, NO_ID),
                (OTHER, mode & 7, NO_ID)]
    return [struct.unpack_from("<HHI", raw, 4 + 8 * i) for i in range((len(raw) - 4) // 8)]


def with_passage(entries: list[tuple[int, int, int]], uid: int) -> list[tuple[int, int, int]]:
    """The entries, with user `uid` allowed through (x); the mask lets it, as setfacl's
    recalculated one would (the group class's permissions, now with x)."""
    mine = [perm for tag, perm, who in entries if tag == USER and who == uid]
    kept = [e for e in entries if not (e[0] == USER and e[2] == uid) and e[0] != MASK]
    kept.append((USER, (mine[0] if mine else 0) | PASS, uid))
    group_class = 0
    for tag, perm, _ in kept:
        group_class |= perm if tag in (USER, GROUP_OBJ, GROUP) else 0
    return sorted([*kept, (MASK, group_class, NO_ID)], key=lambda e: (e[0], e[2]))


def grant_passage(path: Path, uid: int, below: Path = Path("/")) -> list[Path]:
    """Let user `uid` through every folder on the way to `path` that others may not pass
    (no x for others: root's 0700 home, where pyenv's interpreter and the test
    environment may live): one ACL entry each, that user's x alone, nothing to read or
    list. Kept, like the user (the same folders each session). Only the folders under
    `below` are looked at. The folders changed."""
    changed = []
    for folder in reversed([path, *path.parents]):
        if below not in (folder, *folder.parents):
            continue
        if not folder.is_dir() or folder.stat().st_mode & PASS:
            continue
        entries = acl_entries(folder)
        if any(tag == USER and who == uid and perm & PASS for tag, perm, who in entries):
            continue
        packed = struct.pack("<I", ACL_VERSION) + b"".join(
            struct.pack("<HHI", *entry) for entry in with_passage(entries, uid))
        os.setxattr(folder, ACL_XATTR, packed)
        changed.append(folder)
    return changed


def let_through_to_the_environment(user_id: int) -> None:
    """`user_id` let through to the test environment's Python (sys.executable), its base
    interpreter and the repository (PYTHONPATH, the editable install, the job scripts)."""
    for path in (Path(sys.prefix), Path(sys.base_prefix), Path(os.path.realpath(sys.executable)),
                 REPO):
        grant_passage(path, user_id)
