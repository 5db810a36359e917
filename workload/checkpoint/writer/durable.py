"""A checkpoint's files as bytes, without torch: written durably (fsync) and hashed from
memory, JSON read strictly, and the formats a checkpoint never holds (a pickle, a zip
archive) refused by their first bytes. The background writer process
(workload.checkpoint.writer.process) imports this side of the formats only, so that it starts in
a fraction of a second where torch would take seconds; the trees of tensors and their
safetensors files are workload.checkpoint.formats'.
"""

from __future__ import annotations

import hashlib
import json
import os
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from workload.files import create_new, json_text, strict_json

# First bytes of the formats a checkpoint never holds: a pickle (protocol 2 and later
# start with the PROTO opcode 0x80) and a zip archive (torch.save since 1.6).
PICKLE_MAGIC = b"\x80"
ZIP_MAGIC = b"PK\x03\x04"
# The deepest a checkpoint's JSON is nested is about 8 (optimizer state, shard layouts);
# anything much deeper is not a checkpoint, and would exhaust Python's recursion limit.
MAX_DEPTH = 32
# The metadata of every safetensors file a save writes (as safetensors.torch.save's):
# the synchronous save and the writer process write the same bytes.
SAFETENSORS_METADATA = {"format": "pt"}
# Bytes from which write_soon hashes in a thread beside the write: below, the hash
# takes less time than starting a thread (on the development machine 64 KiB of sha256
# took about 0.05 ms, a thread's start and join 0.1 ms).
HASH_IN_A_THREAD = 64 << 10
# Threads that fsync a save's files and folders at once (Syncs): a save has about ten.
SYNC_THREADS = 16


class CorruptCheckpoint(Exception):
    """A checkpoint that is incomplete, altered or unsafe; the message says which file."""


def sniff(file: Path, safetensors_too: bool = False) -> None:
    """CorruptCheckpoint when `file` starts like a pickle or a zip (torch.save) archive.
    A safetensors file is left to its parser unless `safetensors_too` (after the parser
    refused it): its first bytes are its header's length, 0x80 as likely as any."""
    if file.suffix == ".safetensors" and not safetensors_too:
        return
    with open(file, "rb") as f:
        head = f.read(4)
    if head.startswith(PICKLE_MAGIC) or head == ZIP_MAGIC:
        kind = "a pickle" if head.startswith(PICKLE_MAGIC) else "a zip (torch.save) archive"
        raise CorruptCheckpoint(f"{file.parent.name}/{file.name} is {kind}, which a "
                                "checkpoint never holds; refusing to read it")


class Syncs:
    """The fsyncs of a save's files and folders, issued at once rather than one after
    another: each `file` or `folder` is fsynced in a thread (fsync releases the GIL) while
    the next file is written, and `wait` (or the end of the `with` block) returns once
    every one of them is durable, raising the first that failed (a full disk, a file
    system turned read-only). Concurrent fsyncs cost about one: on a journaling file
    system (ext4, XFS) they share a journal commit, and on a parallel one (Lustre, GPFS)
    their round trips to the metadata server overlap. Nothing waits for a single one of
    them: what the save does next (the rename into place) needs them all. Where no thread
    can be had (a pids limit), each is fsynced in place."""

    def __init__(self):
        self._pool: ThreadPoolExecutor | None = ThreadPoolExecutor(
            max_workers=SYNC_THREADS, thread_name_prefix="fsync")
        self._pending: list[Future] = []

    def __enter__(self) -> Syncs:
        return self

    def __exit__(self, kind, error, traceback) -> None:
        try:
            self.wait()
        except OSError:
            if kind is None:  # the block's own error, if any, is the one to raise
                raise

    def file(self, fd: int) -> None:
        """fsync the open descriptor `fd`, then close it (it is this object's now)."""
        self._pending.append(self.later(_sync_and_close, fd))

    def later(self, work, *args) -> Future:
        """`work(*args)` run in a thread beside the rest (a large file's sha256: hashlib
        releases the GIL), or in place where no thread can be had."""
        if self._pool is not None:
            try:
                return self._pool.submit(work, *args)
            except RuntimeError:  # no thread to be had: in place from here on
                self._pool = None
        done: Future = Future()
        try:
            done.set_result(work(*args))
        except Exception as error:  # noqa: BLE001 (raised where its result is asked for)
            done.set_exception(error)
        return done

    def folder(self, path: Path) -> None:
        """fsync the folder `path` (a held path reaches the folder it holds): the names
        of the files created in it made durable."""
        self.file(os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC))

    def wait(self) -> None:
        """Every fsync issued done; the first failure raised once all have ended (every
        descriptor closed)."""
        pending, self._pending = self._pending, []
        failures = [error for error in (future.exception() for future in pending) if error]
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None
        if failures:
            raise failures[0]


def _sync_and_close(fd: int) -> None:
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_durably(path: Path, data: bytes) -> dict:
    """Write `data` into a new file (create_new: FileExistsError for anything already at
    `path`), fsync it, and return the file's manifest entry, hashed from the bytes in
    memory: a save never reads its files back (the load verifies them against it). The
    hash runs in a thread while the file is written and synced (both release the GIL), so
    a large file costs the longer of the two rather than their sum."""
    with Syncs() as syncs:
        entry = write_soon(path, data, syncs)
    return entry.result()


def write_soon(path: Path, data: bytes, syncs: Syncs) -> Future:
    """Write `data` into a new file (create_new: never through a planted link) and hand its
    fsync to `syncs`; the file's manifest entry as a Future, its sha256 taken in a thread
    of `syncs` from the bytes in memory while this file is written and synced and the
    next ones are (a save's large files hashed at once, on as many cores). A small file
    (the JSON parts, a few hundred bytes) is hashed in place, where a thread would cost
    more."""
    if len(data) >= HASH_IN_A_THREAD:
        entry = syncs.later(_entry, data)
    else:
        entry = Future()
        entry.set_result(_entry(data))
    fd = create_new(path)
    try:
        with os.fdopen(fd, "wb", closefd=False) as f:
            f.write(data)
    except BaseException:
        os.close(fd)
        raise
    syncs.file(fd)
    return entry


def _entry(data: bytes) -> dict:
    return dict(bytes=len(data), sha256=hashlib.sha256(data).hexdigest())


def fsync_dir(path: Path) -> None:
    _sync_and_close(os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC))


def json_bytes(data) -> bytes:
    """A part's JSON (workload.checkpoint.formats): numbers as they are, NaN refused."""
    return (json.dumps(data, indent=1, allow_nan=False) + "\n").encode()


def record_bytes(data: dict) -> bytes:
    """config.json and the manifest: keys sorted, a NaN or infinity written as null."""
    return (json_text(data, indent=2) + "\n").encode()


def _too_deep(data) -> bool:
    """Nested deeper than MAX_DEPTH (walked without recursion)."""
    level = [data]
    for _ in range(MAX_DEPTH):
        level = [v for item in level if isinstance(item, (dict, list))
                 for v in (item.values() if isinstance(item, dict) else item)]
        if not level:
            return False
    return True


def read_json(file: Path):
    """Strict JSON (no NaN or Infinity, no number beyond a float's range, nested at most
    MAX_DEPTH), or CorruptCheckpoint naming the file."""
    sniff(file)
    where = f"{file.parent.name}/{file.name}"
    try:
        data = strict_json(file.read_bytes().decode())
    except (ValueError, UnicodeDecodeError, RecursionError) as error:
        raise CorruptCheckpoint(f"{where} is not readable JSON ({str(error)[:200]})") from None
    if _too_deep(data):
        raise CorruptCheckpoint(f"{where} is nested deeper than {MAX_DEPTH} levels, which "
                                "no checkpoint file is")
    return data
