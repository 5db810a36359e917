"""The writer process of asynchronous saves (the loop's side, the staging buffer, the request
and the loop's handle on this process, WriterHandle: workload.checkpoint.background).
Torch-free, so that it starts in a fraction of a second: a save at the first step of a job
(a preemption's, within SLURM's grace time) does not wait seconds for torch to import, and
a node's ranks do not each hold a second copy of torch's libraries.

Each request names the loop's staging buffer (mapped here through /proc/<pid>/fd: the
file has no name) and the checkpoint's files in writing order: a JSON file as its text, a
safetensors file as where each tensor lies in the buffer. safetensors writes each of its
files straight from the buffer (`serialize_file` takes the address of each tensor's bytes:
no copy into Python objects, no torch), and its sha256 is taken from the buffer while the
file is fsynced; the rest is what a save in the trainer does: store.py's
`finish_checkpoint` (the JSON files, the manifest, the commit: folder.py's commit point;
a full disk in one line), then store.py's `end_save`, which copies the checkpoint into the
run folder for the local tier, lets this process answer one JSON line, and only then
prunes the older checkpoints (deleting 137 MB of files takes about 50 ms on the
development machine's ext4): the loop learns of the commit without waiting for it, and the
next request is read once the pruning is done, so a save never meets one in progress.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import mmap
import os
import select
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path

from safetensors import serialize_file

try:  # safetensors 0.8 and later: `serialize_file` takes each tensor's address (no copy)
    from safetensors import TensorSpec
except ImportError:  # earlier releases (a base image's own): each tensor's bytes
    TensorSpec = None

from workload.checkpoint.writer.diskfull import DiskFull, failure_line, guarded_save
from workload.checkpoint.writer.durable import SAFETENSORS_METADATA, Syncs
from workload.checkpoint.writer.store import end_save, finish_checkpoint
from workload.launch.preemption import LOOP_SIGNALS

# Ignored by the writer: the loop's (preemption's, whichever --preempt-signal names: a job
# step's signal reaches every process; Ctrl-C; the stack dump's). The loop blocks them from
# before the writer's start (a blocked mask survives exec) until it ignores them, so one
# sent while it starts cannot kill it.
IGNORED = LOOP_SIGNALS
STOP = {"stop": True}  # the request that ends the writer (background.WriterHandle.stop)


class Buffer:
    """The loop's staging buffer, mapped once; a new one (the state outgrew the old)
    replaces it. Mapped shared and writable, as the loop maps it (ctypes takes the address
    of a writable buffer only); the writer only reads it."""

    def __init__(self):
        self.id: str | None = None
        self.map: mmap.mmap | None = None
        self.first: ctypes.c_char | None = None  # the mapping's first byte, for its address

    def open(self, request: dict) -> int:
        """The address of the request's buffer, mapped."""
        if request["buffer_id"] != self.id:
            self.close()
            fd = os.open(request["buffer"], os.O_RDWR)
            try:
                self.map = mmap.mmap(fd, request["size"])
            finally:
                os.close(fd)
            self.first = ctypes.c_char.from_buffer(self.map)
            self.id = request["buffer_id"]
        return ctypes.addressof(self.first)

    def close(self) -> None:
        self.first = None  # its hold on the mapping first, or close() refuses
        if self.map is not None:
            self.map.close()
        self.id = None
        self.map = None


def _files(request: dict, buffer: Buffer) -> Iterator[tuple[str, bytes | Callable]]:
    """The checkpoint's files, one at a time: JSON as sent, each safetensors file as the
    function that writes it from the buffer (its layout: offset, dtype, shape and bytes
    per tensor) and returns its manifest entry."""
    address = buffer.open(request)
    for name, content in request["files"]:
        if "json" in content:
            yield name, content["json"].encode()
        else:
            yield name, partial(_write_tensors, buffer, address, content["tensors"])


def _write_tensors(buffer: Buffer, address: int, layout: dict, path: Path,
                   syncs: Syncs) -> dict:
    """A safetensors file written by safetensors itself straight from the buffer (no copy
    through Python), its fsync handed to `syncs` (store.finish_checkpoint waits for all of
    a save's at once), and its sha256 taken in a thread of `syncs` beside the next file's
    write: from the header it wrote (read back: a few hundred bytes) and the buffer's own
    bytes in the file's order, which the format fixes (the header's data_offsets tile the
    data, no holes). Its manifest entry, a Future; a failed fsync (a file system turned
    read-only under it) fails the save at the wait."""
    serialize_file({key: _spec(buffer, address, *where) for key, where in layout.items()},
                   str(path), metadata=SAFETENSORS_METADATA)
    with open(path, "rb") as file:
        length = file.read(8)
        head = length + file.read(int.from_bytes(length, "little"))
        size = os.fstat(file.fileno()).st_size
        syncs.file(os.dup(file.fileno()))
    return syncs.later(_entry, buffer, layout, head, size)


def _entry(buffer: Buffer, layout: dict, head: bytes, size: int) -> dict:
    return dict(bytes=size, sha256=_digest(buffer, layout, head, size))


def _digest(buffer: Buffer, layout: dict, head: bytes, size: int) -> str:
    """The sha256 of the safetensors file of `size` bytes that starts with `head` (its
    length and header), its data taken from the buffer in the header's order."""
    digest = hashlib.sha256(head)
    header = json.loads(head[8:])
    at = len(head)
    data = memoryview(buffer.map)
    try:
        for begin, end, key in sorted((*header[key]["data_offsets"], key) for key in layout):
            offset = layout[key][0]
            nbytes = layout[key][3]
            if len(head) + begin != at or end - begin != nbytes:
                raise ValueError(f"{key}: the file holds it elsewhere than its layout says")
            digest.update(data[offset:offset + nbytes])
            at += nbytes
    finally:
        data.release()
    if at != size:
        raise ValueError(f"the safetensors file has {size} bytes, its tensors end at {at}")
    return digest.hexdigest()


def _spec(buffer: Buffer, address: int, offset: int, dtype: str, shape: list, nbytes: int):
    """One tensor of the buffer as `serialize_file` takes it: its address, or (before
    safetensors 0.8) a copy of its bytes."""
    if TensorSpec is None:
        return {"dtype": dtype, "shape": shape, "data": buffer.map[offset:offset + nbytes]}
    return TensorSpec(dtype=dtype, shape=shape, data_ptr=address + offset, data_len=nbytes)


def _save(request: dict, buffer: Buffer, answer: Callable[[Path], None]) -> None:
    """The request's checkpoint written and committed (store.finish_checkpoint), then
    ended as a save in the trainer ends (store.end_save): copied into the run folder for
    the local tier, `answer` told where it is, then the older ones pruned."""
    root = Path(request["root"])
    tmp = Path(request["tmp"])
    final = root / request["final"]
    with guarded_save(root, tmp, lambda: request["size"]):
        finish_checkpoint(tmp, final, _files(request, buffer), request["header"])
    copy_to = request.get("copy_to")
    end_save(final, request["keep"], Path(copy_to) if copy_to else None, answer)


def die_with(parent: int, started_by_main_thread: bool) -> None:
    """SIGKILL this process as soon as the process `parent` ends, and now if it already
    has: watched from a thread here, since Linux's parent-death signal follows the
    *thread* that started this process, and a loop may save from a thread of its own
    that ends long before the loop does. Started by the main thread, the signal is armed
    too: the kernel's SIGKILL also ends a writer that is stopped (SIGSTOP), whose watching
    thread cannot run."""
    if started_by_main_thread:
        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)
    threading.Thread(target=_watch, args=(parent,), daemon=True).start()


def _watch(parent: int) -> None:
    """Wait for `parent` to end: on a pidfd where Linux has one (5.3 and later), else by
    asking for this process's parent every 0.1 s; then SIGKILL this process."""
    try:
        pidfd = os.pidfd_open(parent)
    except OSError:  # ESRCH: gone already; ENOSYS: an older kernel
        pidfd = None
    if os.getppid() == parent:  # after the open: the pidfd is that of the parent
        if pidfd is not None:
            select.select([pidfd], [], [])  # readable once the process has ended
        while os.getppid() == parent:  # at once after a pidfd, polled without one
            time.sleep(0.1)
    os.kill(os.getpid(), signal.SIGKILL)


def serve() -> None:
    """Answer each request line with one JSON line, until told to stop (or the input
    ends: the loop died)."""
    for number in IGNORED:
        signal.signal(number, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, IGNORED)  # pending ones are dropped
    replies = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # anything else printed goes to stderr, never into the answers
    buffer = Buffer()
    for line in sys.stdin:
        request = json.loads(line)
        if request == STOP:
            break
        try:
            _save(request, buffer, lambda saved: _answer(replies, {"saved": str(saved)}))
        except DiskFull as error:
            _answer(replies, {"disk_full": str(error)})
        except Exception as error:  # noqa: BLE001 (sent back, the loop raises it)
            _answer(replies, _failure(error, request))
    buffer.close()


def _failure(error: Exception, request: dict) -> dict:
    """The answer to a failed save: its one line, the same as a save in the loop's
    (diskfull.failure_line: a run folder turned read-only named as such)."""
    return {"error": failure_line(error, request["root"])}


def _answer(replies, reply: dict) -> None:
    replies.write(json.dumps(reply) + "\n")
    replies.flush()


if __name__ == "__main__":
    die_with(int(sys.argv[1]), sys.argv[2] == "main")
    serve()
