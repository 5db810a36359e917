"""Asynchronous saves, the training loop's side: the loop waits only while the state is
copied into a staging buffer in host memory; the writer process (workload.checkpoint.
writer.process) writes the checkpoint from it. `WriterHandle` is the loop's handle on that process.

Why a process and not a thread: a writer thread hashing and writing hundreds of MB holds
the GIL for much of that time and slows the training loop it was meant to free
(torch.distributed.checkpoint moved its async saves to a process for this reason,
pytorch/pytorch#147039).

The staging buffer is one file in /dev/shm (else the temporary folder), mapped by both
processes and reused by every save (grown when a state outgrows it; its size is printed
once per size). The loop copies every tensor of the snapshot into it and sends the
writer one JSON line: the snapshot's tree with its tensors as references (the encoding
of workload.checkpoint.formats), where each tensor lies in the buffer, and the save's
temporary folder. No pickle crosses the pipe. The writer writes the files from the buffer
and commits them as a save in the trainer does (workload.checkpoint.writer.folder: the
commit point), copies the checkpoint into the run folder for the local tier, answers one
JSON line, and only then prunes (workload.checkpoint.writer.process). At most one save is
in flight: the next save, a resume and `stop` first wait for its answer, so the buffer is
never overwritten while read.

The writer ignores the loop's signals (a job step's SIGTERM reaches every process;
workload.launch.preemption's LOOP_SIGNALS) from its start: the loop decides when to stop
and waits for the save in flight first. A writer that dies (kill -9, out of memory) leaves
only the temporary folder, which is never resumed from: the next resume moves it aside
with one line and takes the previous checkpoint. When the loop's process dies, its writer
kills itself (writer.die_with: a thread of it watches the loop's process, and the kernel's
parent-death signal is armed too when the loop's main thread started it): a save it held
is left unfinished, moved aside at the next resume, and a new run on the folder never
meets a writer of the old one still renaming folders and replacing `latest`. The buffer's
file is unlinked as soon as the loop has mapped it (the writer maps it through
/proc/<pid>/fd), so no kill leaves it behind.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import torch

from workload.checkpoint.writer import process as writer
from workload.checkpoint.writer.diskfull import DiskFull, mib
from workload.checkpoint.writer.folder import step_name
from workload.checkpoint.formats import unique_key
from workload.checkpoint.inprocess import HOLDERS, snapshot_bytes
from workload.checkpoint.snapshot import checkpoint_files
from workload.checkpoint.stall import STALL_SAY_S, StallWatch
from workload.checkpoint.writer.store import Snapshot, header
from workload.errors import UsageError
from workload.held import fd_path, let_go
from workload.logs import logger, say

ALIGN = 64  # every tensor starts at a multiple of this: a view of any dtype is aligned


class WriterFailed(UsageError):
    """The background writer died or failed; str() is one line (train: its error line and
    exit status 2, as a full disk)."""


class NoBackground(OSError):
    """An asynchronous save cannot be made here; str() is one line, and `hint` what would
    make the saves asynchronous (the saves are synchronous from then on)."""
    hint = ""


class NoStagingRoom(NoBackground):
    """No folder has room for the staging buffer."""
    hint = " (a larger /dev/shm, e.g. docker run --shm-size, makes the saves asynchronous)"


class NoWriter(NoBackground):
    """The writer process could not start: a pids limit (fork's EAGAIN), an interpreter
    that cannot be run again (removed, or on a noexec mount)."""


STAGING_FOLDERS = (Path("/dev/shm"), None)  # None: the temporary folder


def _reserved_file(size: int) -> Path:
    """A new file of `size` bytes whose space is reserved (posix_fallocate), in /dev/shm,
    else the temporary folder. Reserved, because a mapped file on a tmpfs without room
    for it kills the process with SIGBUS at the first page written (Docker's /dev/shm is
    64 MB unless --shm-size says more)."""
    tried = []
    for folder in STAGING_FOLDERS:
        folder = Path(tempfile.gettempdir()) if folder is None else folder
        path = folder / f"hpc-train-staging-{os.getpid()}-{uuid.uuid4().hex}"
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        except OSError as error:
            tried.append(f"{folder}: {error.strerror}")
            continue
        try:
            os.posix_fallocate(fd, 0, size)
            return path
        except OSError as error:
            path.unlink(missing_ok=True)
            tried.append(f"{folder}: {error.strerror}")
        finally:
            os.close(fd)
    raise NoStagingRoom(f"no room for the {mib(size)} checkpoint staging buffer "
                        f"({'; '.join(tried)})")


class Stage:
    """The staging buffer: a file mapped into memory, reused while the state fits."""

    def __init__(self):
        self.fd: int | None = None  # keeps the nameless file reachable for the writer
        self.id: str | None = None
        self.buffer: torch.Tensor | None = None

    def fit(self, size: int) -> None:
        if self.buffer is not None and self.buffer.numel() >= size:
            return
        self.drop()
        path = _reserved_file(max(size, 1))
        try:
            self.fd = os.open(path, os.O_RDWR)
            self.buffer = torch.from_file(str(path), shared=True, size=max(size, 1),
                                          dtype=torch.uint8)
        finally:
            # Nameless from here on: its memory goes when both processes let go of it, so
            # a kill -9 of either leaves nothing behind in /dev/shm.
            path.unlink()
        self.id = path.name
        say(f"checkpoint staging buffer: {mib(size)} ({size} bytes) of host memory in "
            f"{path.parent}, reused by every asynchronous save")

    def copy_in(self, snapshot: Snapshot) -> dict:
        """The checkpoint's files for the writer: JSON as text, each safetensors file as
        where its tensors lie in the buffer, copied there (the state may change once this
        returns)."""
        parts = [snapshot.model, snapshot.optimizer, snapshot.trainer, snapshot.rng]
        self.fit(snapshot_bytes(snapshot) + ALIGN * sum(1 for _ in _tensors(parts)))
        offset = 0

        def put(tensors: dict, key: str, tensor: torch.Tensor) -> str:
            nonlocal offset
            key = unique_key(tensors, key)
            nbytes = tensor.numel() * tensor.element_size()
            view = self.buffer[offset:offset + nbytes].view(tensor.dtype).view(tensor.shape)
            view.copy_(tensor.detach())
            tensors[key] = [offset, str(tensor.dtype).removeprefix("torch."),
                            list(tensor.shape), nbytes]
            offset += -(-nbytes // ALIGN) * ALIGN
            return key

        files = [[name, {"json": content.decode()} if isinstance(content, bytes)
                  else {"tensors": content}]
                 for name, content in checkpoint_files(snapshot, put)]
        return {"buffer": str(fd_path(self.fd)), "buffer_id": self.id,
                "size": self.buffer.numel(), "files": files, "header": header(snapshot),
                "final": step_name(snapshot.trainer["step"])}

    def drop(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
        self.fd = None
        self.id = None
        self.buffer = None


def _tensors(value):
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (dict, list, tuple)):
        for item in value.values() if isinstance(value, dict) else value:
            if isinstance(item, HOLDERS):
                yield from _tensors(item)


def _starting_thread() -> str:
    """Which thread starts the writer: "main", or "thread" (writer.die_with)."""
    return "main" if threading.current_thread() is threading.main_thread() else "thread"


def _start_writer() -> subprocess.Popen:
    """The writer process, with the signals it ignores blocked until it ignores them;
    NoWriter when it cannot start."""
    before = signal.pthread_sigmask(signal.SIG_BLOCK, writer.IGNORED)
    try:
        return subprocess.Popen([sys.executable, "-m", writer.__name__, str(os.getpid()),
                                 _starting_thread()],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    except OSError as error:
        raise NoWriter(f"the checkpoint writer process could not start ({sys.executable}: "
                       f"{error.strerror or error})") from None
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)


class WriterHandle:
    """The loop's handle on its writer process (started at the first save) and on the save
    in flight (at most one)."""

    def __init__(self):
        self.stage = Stage()
        # The writer the loop waits for now, None while it waits for none: read by the
        # stall watchdog's thread (through Session.waited_writer).
        self.waited: StallWatch | None = None
        self.proc: subprocess.Popen | None = None
        self.in_flight: int | None = None  # the step being written
        # Its folder's held path (workload.held.make_held): the writer reaches the folder through
        # this process's descriptor, closed once the writer has answered.
        self.held: Path | None = None
        self.answer: str | None = None  # the writer's answer to it, read before `wait`

    def submit(self, root: Path, tmp: Path, snapshot: Snapshot, keep: int,
               copy_to: Path | None = None) -> None:
        """Stage the snapshot and hand it to the writer (the previous save is done);
        `copy_to`: the run folder's checkpoints, where the writer copies the committed
        checkpoint (--checkpoint-local)."""
        request = self.stage.copy_in(snapshot)
        request.update(root=str(root), tmp=str(tmp), keep=keep,
                       copy_to=None if copy_to is None else str(copy_to))
        if self.proc is None:
            self.proc = _start_writer()
        self.in_flight = snapshot.trainer["step"]
        self.held = tmp
        try:
            self.proc.stdin.write(json.dumps(request, allow_nan=False) + "\n")
            self.proc.stdin.flush()
        except OSError:  # the writer is gone: wait() says how
            pass

    def failed_by_now(self) -> bool:
        """Without waiting: whether the save in flight failed or the writer died (`wait`
        then raises why). An answer that came is kept for `wait`."""
        if self.proc is None:
            return False
        if self.in_flight is None:
            return self.proc.poll() is not None
        if self.answer is None and select.select([self.proc.stdout], [], [], 0)[0]:
            self.answer = self.proc.stdout.readline()  # "" at the end: the writer died
        if self.answer is None:
            return False
        # Its save committed, the answer read by an earlier look: the writer may have died
        # since, which the next save would meet only when it is handed over.
        return "saved" not in json.loads(self.answer or "{}") or self.proc.poll() is not None

    def wait(self, flag=None) -> None:
        """Until the save in flight is committed; DiskFull or WriterFailed if it was not,
        WriterFailed too when the writer died since (the next save would be lost).
        `flag`: the loop's PreemptionFlag (workload.launch), acted on while it waits."""
        if self.proc is None:
            return
        if self.in_flight is not None:
            step = self.in_flight
            self.in_flight = None
            line = self.answer or self._answer(step, flag)
            self.answer = None
            self._let_go()
            if not line:
                self._died(f"while saving step {step}; that checkpoint was not committed")
            reply = json.loads(line)
            if "disk_full" in reply:
                raise DiskFull(reply["disk_full"])
            if "error" in reply:
                raise WriterFailed(f"the checkpoint writer could not save step {step}: "
                                   f"{reply['error']}")
        if self.proc.poll() is not None:
            self._died("after its last save, which was committed")

    def _answer(self, step: int, flag) -> str:
        """The writer's answer line ("" when it died), waited for in slices: a writer that
        takes long is named with its state at 10, 20, 40 ... s, and a preemption signal
        that comes while it is stopped leaves without this save at once (exit 75), while
        it waits for its disk after DISK_WAIT_S, while it is hung after HUNG_S (stall.py)."""
        started = time.monotonic()
        say_at = STALL_SAY_S
        self.waited = stuck = StallWatch(self.proc.pid, step)
        try:
            while not select.select([self.proc.stdout], [], [], 1.0)[0]:
                if time.monotonic() - started >= say_at:
                    say_at *= 2
                    logger.warning(f"still waiting for {stuck.waiting()}")
                signal_name = flag.signal_name if flag is not None else None
                if signal_name and stuck.stuck(signal_name):
                    self._abandon(step, signal_name, stuck.named())
        finally:
            self.waited = None
        return self.proc.stdout.readline()

    def _abandon(self, step: int, signal_name: str, named: str) -> None:
        """A preemption while the writer is stopped or hung: it is killed, the save it held
        is left unfinished (moved aside at the next resume), and the process exits for a
        requeue, as from a preemption's save (workload.launch.exit_for_requeue)."""
        from workload.launch.preemption import exit_for_requeue

        self.proc.kill()  # SIGKILL ends a stopped process too
        self.proc.wait()
        self.proc = None
        self.in_flight = None
        self._let_go()
        logger.warning(f"{signal_name} while the checkpoint writer ({named}) held the save "
                       f"of step {step}: leaving without it; the next run resumes from the "
                       "newest committed checkpoint")
        exit_for_requeue(step, signal_name)

    def _let_go(self) -> None:
        if self.held is not None:
            let_go(self.held)
        self.held = None

    def _died(self, when: str) -> None:
        status = self.proc.wait()
        self.proc = None
        how = f"killed by signal {-status}" if status < 0 else f"exit status {status}"
        raise WriterFailed(f"the checkpoint writer process died ({how}) {when}; training "
                           "stops rather than run on without checkpoints (a new run resumes "
                           "from the newest committed one)")

    def stop(self) -> None:
        """End the writer (after `wait`) and remove the staging buffer. The writer is told
        to stop in so many words: the end of its input is not enough, since processes
        forked after it started (DataLoader workers) hold the pipe's other end too, and
        it would wait for them while this process waits for it."""
        if self.proc is not None:
            try:
                self.proc.stdin.write(json.dumps(writer.STOP) + "\n")
                self.proc.stdin.close()
            except OSError:  # the writer is gone already
                pass
            self.proc.wait()
            self.proc = None
        self._let_go()
        self.stage.drop()
