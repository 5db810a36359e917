"""One writer per run folder: `<output-dir>/train.lock`, taken by rank 0 before anything is
written, held until the run ends.

Why a lock file made by an exclusive hard link and not flock/fcntl: the holder writes its
details into a file of its own, then links it to `train.lock`; link() fails when the name
exists, atomically on every file system clusters use (local disks, NFSv2 to v4, Lustre,
GPFS, BeeGFS), and the lock is complete the moment it appears. flock is local to one client
on many NFS and Lustre mounts (Lustre's default `localflock`, or no flock at all), and fcntl
locks need a working lock daemon (NFSv3's NLM) and vanish silently when it restarts. The
file says who holds it: host, PID, SLURM job id, start time.

A lock left by a process that died is stale and taken over (with a warning):
  - same host (and PID namespace): the PID no longer runs, or runs a process that started
    at another time (a reused PID);
  - another host: the holder refreshes the file's mtime every HEARTBEAT_S seconds; a lock
    not refreshed for STALE_AFTER_S seconds is stale. Its age is measured against the file
    server's clock (the mtime of a file just created beside it), so clock skew between
    nodes does not matter;
  - an earlier step of this SLURM job, when the job script says that step ended
    (TRAIN_PREVIOUS_STEP_ENDED=1, a restart inside the allocation: docs/failures.md).
A stale lock is renamed away (atomic) before a new one is created, so two processes that
judge it stale at once cannot both end up holding it.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from workload.config import out_of_range
from workload.errors import UsageError
from workload.files import open_regular, proc_stat_fields, set_mode, umask_mode
from workload.logs import logger
from workload.runfolder import RunFolder

HEARTBEAT_S = 30.0
STALE_AFTER_S = 300.0  # ten missed heartbeats: longer than NFS attribute caching (60 s)
# What link() fails with where the file system has no hard links: vfat/exFAT (EPERM), many
# FUSE and object-store mounts (ENOSYS, EOPNOTSUPP), union mounts that cannot link (EXDEV).
NO_HARD_LINKS = {errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.ENOSYS, errno.EXDEV}
MAX_LOCK_BYTES = 64 << 10  # what me() writes takes a few hundred bytes: more is not train's


class Refused(Exception):
    """The lock cannot be taken for a reason other than a holder; str() is one line."""


def _start_time(pid: int) -> str | None:
    """The start time of a process (clock ticks since boot), None if it does not run."""
    fields = proc_stat_fields(pid)
    return fields[19] if fields else None


def _pid_namespace() -> str:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


# Set by jobs/lib/requeue.sh for a step it starts after an earlier step of the same job
# ended (a restart inside the allocation): that step's lock is stale wherever it was.
PREVIOUS_STEP_ENDED = "TRAIN_PREVIOUS_STEP_ENDED"


def me() -> dict:
    return dict(host=socket.gethostname(), pid=os.getpid(),
                job_id=os.environ.get("SLURM_JOB_ID", ""),
                step_id=os.environ.get("SLURM_STEP_ID", ""),
                started=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                pid_start=_start_time(os.getpid()), pid_ns=_pid_namespace(),
                token=uuid.uuid4().hex)


def describe_holder(holder: dict) -> str:
    """Who holds the lock, in words (host, PID, SLURM job, start time)."""
    if not readable(holder):
        return "a lock file that is not one train wrote (unreadable)"
    job = f", SLURM job {holder['job_id']}" if holder.get("job_id") else ""
    return (f"host {holder.get('host', '?')} PID {holder.get('pid', '?')}{job}, "
            f"started {holder.get('started', '?')}")


def _fs_now(folder: Path) -> float:
    """Now, by the clock of the file system holding `folder`."""
    with tempfile.NamedTemporaryFile(dir=folder, prefix=".clock-") as probe:
        return os.fstat(probe.fileno()).st_mtime


def stale_reason(path: Path, holder: dict, mtime: float) -> str | None:
    """Why the lock at `path` (last refreshed at `mtime`) is stale, or None while its
    holder may still run."""
    mine = me()
    if ended_step_of_this_job(holder, mine):
        return (f"it is step {holder['step_id']}'s of this job ({mine['job_id']}), which "
                "ended before the job script started this one")
    if holder.get("host") == mine["host"] and holder.get("pid_ns") == mine["pid_ns"]:
        pid = holder.get("pid")
        running = None if out_of_range("pid", pid) else _start_time(pid)
        if running is None or (holder.get("pid_start") not in (None, running)):
            return f"process {pid} no longer runs on {mine['host']}"
        return None
    age = _fs_now(path.parent) - mtime
    if age > STALE_AFTER_S:
        return f"its heartbeat stopped {age:.0f} s ago (stale after {STALE_AFTER_S:.0f} s)"
    return None


def ended_step_of_this_job(holder: dict, mine: dict) -> bool:
    """The holder is an earlier step of this very job, and the job script says the step
    before this one ended: a restart on a spare node after a node was lost, whose new
    rank 0 may be on another host than the lost one (which never released its lock, and
    would otherwise hold the run for STALE_AFTER_S)."""
    return (os.environ.get(PREVIOUS_STEP_ENDED) == "1" and bool(mine["job_id"])
            and holder.get("job_id") == mine["job_id"]
            and isinstance(holder.get("step_id"), str) and bool(mine["step_id"])
            and holder["step_id"] != mine["step_id"])


def readable(holder: dict) -> bool:
    """Whether the lock file held what `me()` writes (at least who holds it)."""
    return isinstance(holder.get("host"), str) and not out_of_range("pid", holder.get("pid"))


@contextmanager
def _opened(path: Path, named: str = "--output-dir") -> Iterator[tuple[os.stat_result, dict]]:
    """The lock file's status and holder, through one descriptor opened without following
    a link or waiting (files.open_regular: a FIFO would hold the run forever) and held
    open meanwhile, so its inode cannot be reused: what is judged stale is what _break
    removes, never a file reached through a neighbour's link."""
    try:
        fd = open_regular(path, follow_links=False)
    except OSError as error:
        if error.errno not in (errno.ELOOP, errno.EINVAL):
            raise  # FileNotFoundError: released meanwhile
        what = (f"{path} is a symbolic link" if error.errno == errno.ELOOP
                else error.strerror.removesuffix(", not a file"))
        raise Refused(f"{what}, not the lock file train keeps there; move it away (mv {path} "
                      f"{path}.moved) or pass another {named}") from None
    with open(fd, "rb") as file:
        info = os.fstat(fd)
        raw = file.read(MAX_LOCK_BYTES + 1)
        try:
            holder = json.loads(raw) if len(raw) <= MAX_LOCK_BYTES else {}
        except (ValueError, RecursionError):  # damaged, or not written by train
            holder = {}
        yield info, holder if isinstance(holder, dict) else {}


def _no_hard_links(path: Path, error: OSError, named: str) -> Refused:
    return Refused(f"{named} {path.parent} is on a file system without hard links "
                   f"(link() failed: {error.strerror}; vfat, exFAT, some FUSE and object-store "
                   f"mounts), and the run folder's lock {path.name} is made by one; pass "
                   f"{named} on a file system with hard links, e.g. a folder under "
                   f"your scratch or home directory")


def _link(draft: Path, path: Path, named: str) -> bool:
    """Create `path` as a hard link to the written draft: atomic, and complete the moment it
    appears. NFS may report an error for a link that was made: the link count decides."""
    try:
        os.link(draft, path)
        return True
    except FileExistsError:
        return False
    except OSError as error:
        if draft.stat().st_nlink == 2:
            return True
        if error.errno in NO_HARD_LINKS:
            raise _no_hard_links(path, error, named) from None
        return False


def _break(path: Path, judged: os.stat_result) -> None:
    """Rename the stale lock away; if what was renamed is not the file judged stale
    (another process took it over meanwhile, or a neighbour swapped the name), put it
    back. The file renamed is told by its identity on an open descriptor, not read again
    through its name."""
    aside = path.with_name(f".{path.name}.stale-{socket.gethostname()}-{os.getpid()}")
    os.replace(path, aside)
    if _identity(aside) != (judged.st_dev, judged.st_ino):
        try:
            os.link(aside, path)  # link() does not follow a link: the name comes back as it was
        except FileExistsError:
            pass
    aside.unlink()


def _identity(path: Path) -> tuple[int, int] | None:
    """The (device, inode) of the regular file `path` itself, None for anything else."""
    try:
        fd = open_regular(path, follow_links=False)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        return info.st_dev, info.st_ino
    finally:
        os.close(fd)


def _draft(path: Path, holder: dict) -> Path:
    """The holder's details in a new file of its own beside the lock, to be linked to it:
    made by mkstemp, so no name a neighbour could predict and no link followed."""
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.draft-")
    with os.fdopen(fd, "w") as file:
        file.write(json.dumps(holder, indent=2) + "\n")
        set_mode(fd, umask_mode())
    return Path(name)


class RunLock:
    """The lock of one run folder, held from `acquire` until `release`. `named`: how the
    messages name the folder's setting (train's flag, or the folder a user's script
    gave workload.checkpoint.Checkpoints)."""

    def __init__(self, out: Path, named: str = "--output-dir"):
        self.path = RunFolder(Path(out)).lock
        self.named = named
        self.holder: dict | None = None
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None

    def acquire(self) -> str | None:
        """Take the lock: None when taken, else why not (naming the holder)."""
        holder = me()
        draft = _draft(self.path, holder)
        try:
            for _ in range(5):
                if _link(draft, self.path, self.named):
                    self._hold(holder)
                    return None
                try:
                    refusal = self._judge()
                except FileNotFoundError:  # released meanwhile: try again
                    continue
                if refusal:
                    return refusal
            return f"{self.path} keeps changing hands; another run is starting in this folder"
        except Refused as refusal:
            return str(refusal)
        finally:
            draft.unlink()

    def _judge(self) -> str | None:
        """A refusal naming the live holder, or None after breaking a stale lock."""
        with _opened(self.path, self.named) as (seen, holder):
            reason = stale_reason(self.path, holder, seen.st_mtime)
            if reason is None:
                return self._refusal(holder)
            logger.warning(f"taking over the lock of a run that ended without releasing it "
                           f"({describe_holder(holder)}): {reason}")
            _break(self.path, seen)
        return None

    def _refusal(self, holder: dict) -> str:
        """Why a lock that is not stale keeps this run out."""
        if not readable(holder):
            return (f"{self.path} is not a lock file train wrote (its content is not the "
                    f"holder's JSON); if no run uses {self.named} {self.path.parent}, remove "
                    f"it (rm {self.path}) and start again; left alone, it is taken over "
                    f"once unchanged for {STALE_AFTER_S:.0f} s")
        return (f"{self.named} {self.path.parent} is in use by another run "
                f"({describe_holder(holder)}; lock file {self.path}); wait for it to "
                f"end, stop it, or pass another {self.named}. A lock whose process died is "
                f"taken over: on the same host at once, from another host after "
                f"{STALE_AFTER_S:.0f} s without its heartbeat")

    def _hold(self, holder: dict) -> None:
        self.holder = holder
        self._stop.clear()
        self._beat = threading.Thread(target=self._heartbeat, name="run-lock-heartbeat",
                                      daemon=True)
        self._beat.start()

    def _heartbeat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            try:
                # No times given: the file server's clock on NFS. A link a
                # neighbour put at the name is not followed.
                os.utime(self.path, follow_symlinks=False)
            except OSError as error:
                logger.warning(f"cannot refresh the run folder's lock {self.path}: {error}")

    def release(self) -> None:
        """Stop the heartbeat and remove the lock if it is still this process's."""
        if self.holder is None:
            return
        self._stop.set()
        if self._beat is not None:
            self._beat.join()
        try:
            with _opened(self.path) as (_, holder):
                if holder.get("token") == self.holder["token"]:
                    self.path.unlink()
        except (OSError, Refused):  # gone, or replaced by something else: not ours
            pass
        self.holder = None


@contextmanager
def lock_run_folder(out: Path, info, named: str = "--output-dir"):
    """Rank 0 takes the run folder's lock; every rank learns whether it did (one
    all-reduce) and all stop with one line when it did not, before anything is written."""
    from workload import distributed  # torch: only once a run starts

    lock = RunLock(out, named)
    refusal = lock.acquire() if info.is_main else None
    refused = refusal is not None
    if info.world_size > 1:
        refused = distributed.any_rank([refused], info.device)[0]
    if refused:
        raise UsageError(refusal or f"rank 0 could not lock {named} {out}: see its error")
    try:
        yield lock
    finally:
        lock.release()
