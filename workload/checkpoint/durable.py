"""A checkpoint's files as bytes, without torch: written durably (fsync) and hashed from
memory, JSON read strictly, and the formats a checkpoint never holds (a pickle, a zip
archive) refused by their first bytes. The background writer process
(workload.checkpoint.writer) imports this side of the formats only, so that it starts in
a fraction of a second where torch would take seconds; the trees of tensors and their
safetensors files are workload.checkpoint.formats'.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
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
# Bytes from which write_durably hashes in a thread beside the write: below, the hash
# takes less time than starting a thread (on the development machine 64 KiB of sha256
# took about 0.05 ms, a thread's start and join 0.1 ms).
HASH_IN_A_THREAD = 64 << 10


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


def write_durably(path: Path, data: bytes) -> dict:
    """Write `data` into a new file (create_new: FileExistsError for anything already at
    `path`), fsync, and return the file's manifest entry, hashed from the bytes in
    memory: a save never reads its files back (the load verifies them against it). The
    hash runs in a thread while the file is written and synced (both release the GIL), so
    a large file costs the longer of the two rather than their sum; a small one (the JSON
    parts, a few hundred bytes) is hashed in place, where a thread would cost more."""
    digest = hashlib.sha256()
    hashing = None
    if len(data) >= HASH_IN_A_THREAD:
        hashing = threading.Thread(target=digest.update, args=(data,))
        try:
            hashing.start()
        except RuntimeError:  # no thread to be had (a pids limit): hashed in place
            hashing = None
    if hashing is None:
        digest.update(data)
    try:
        with os.fdopen(create_new(path), "wb") as f:  # never through a planted link
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    finally:
        if hashing is not None:
            hashing.join()
    return dict(bytes=len(data), sha256=digest.hexdigest())


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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
