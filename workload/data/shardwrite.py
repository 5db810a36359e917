"""`train --dataset imagefolder --data-dir SRC --prepare-data --shards DEST`: an image
folder packed into tar shards (the layout: shardformat.py).

The images are listed as the image-folder reader lists them (the same classes, order and
link rules: imagefolder.load_imagefolder) and cut into shards of `--shard-size` images in
that order. The same source always gives byte-identical shards: the tar headers carry
only names and sizes (shardformat.member_header), never times or owners.

The source is only read. DEST belongs to one state of one source: `.shards-of.json`,
written first, records the source's identity (stagefiles.identity: its path and every
file's size and times); a DEST that holds another dataset, or files not written here, is
refused, and one writer at a time holds `DEST/.lock`. Writing resumes: each shard's index
line is appended to its split's index file (fsynced) once the shard is complete, so a
shard whose line is there and whose bytes still match the sha256 it records is kept; any
other is written again (to a hidden partial file first, renamed when complete). At a
split's end its index file is rewritten with one line per shard in order, and
`manifest.json`, which says where each line is, is written last: a folder without it was
never finished. A rewrite with another `--shard-size` removes the earlier write's shards
past the new count, only those its index lists with their bytes (the list the writer
keeps), and says which; nothing else in the folder is removed (DALI's `wds2idx` indexes
beside the shards included).
"""

from __future__ import annotations

import io
import os
import stat
import tarfile
import time
from pathlib import Path

from workload.data.datasets import UNREADABLE, bad_file_note, open_rgb
from workload.data.shardformat import (FORMAT, FORMAT_VERSION, MANIFEST, MAX_MEMBER_BYTES,
                                       SHARD_NAME, index_name, member_header, sample_key,
                                       shard_name)
from workload.data.stagefiles import NoLocks, identity, try_exclusive
from workload.errors import UsageError
from workload.files import (json_text, mode_kind, open_append, read_json_file,
                            read_jsonl_records, read_regular, replacing, sha256_file,
                            unwritable_reason, write_json)
from workload.logs import logger

SHARD_SIZE = 1000  # images per shard: about 100 MB of ImageNet photographs
OWNER = ".shards-of.json"  # which source state DEST holds
PROGRESS_EVERY_S = 10.0


class Progress:
    """Progress lines with the rate and the time left, at most every PROGRESS_EVERY_S."""

    def __init__(self, total: int):
        self.total = total
        self.done = 0
        self.started = time.perf_counter()
        self.last = self.started

    def add(self, count: int, force: bool = False) -> None:
        self.done += count
        now = time.perf_counter()
        if not force and now - self.last < PROGRESS_EVERY_S:
            return
        self.last = now
        rate = self.done / max(now - self.started, 1e-9)
        left = (self.total - self.done) / rate if rate else 0.0
        logger.info(f"shards: {self.done:,}/{self.total:,} images "
                    f"({100 * self.done / max(self.total, 1):.0f} %), {rate:,.0f} images/s, "
                    f"about {left:,.0f} s left")


def write_shards(source: Path, dest: Path, shard_size: int = SHARD_SIZE) -> str:
    """Pack the image folder `source` into shards in `dest`; what was done, in one line."""
    from workload.data.imagefolder import load_imagefolder  # torchvision: seconds

    train, val = load_imagefolder(str(source), 32)  # the listing and its rules only
    key = identity(source)
    lock = claim(source, dest, key)
    try:
        splits = {}
        kept = 0
        removed: list[str] = []
        progress = Progress(len(train.samples) + len(val.samples))
        for split, folder in (("train", train), ("val", val)):
            entries, kept_here, gone = write_split(dest, split, folder.samples, shard_size,
                                                   progress)
            splits[split] = dict(samples=sum(e["samples"] for e in entries), shards=entries)
            kept += kept_here
            removed += gone
        progress.add(0, force=True)
        write_json(dest / MANIFEST, dict(format=FORMAT, format_version=FORMAT_VERSION,
                                         source=str(source), identity=key,
                                         classes=list(train.classes), splits=splits))
    finally:
        if lock is not None:
            os.close(lock)
    count = sum(len(s["shards"]) for s in splits.values())
    gone = (f"; removed the {len(removed)} shards of an earlier write that its index "
            f"listed ({', '.join(removed[:3])}{', ...' if len(removed) > 3 else ''})"
            if removed else "")
    return (f"shards of {source} in {dest}: {splits['train']['samples']} training and "
            f"{splits['val']['samples']} validation images in {count} shards ({kept} "
            f"complete ones kept from an earlier run{gone}); train from them with "
            f"--dataset shards --data-dir {dest}")


def claim(source: Path, dest: Path, key: str) -> int | None:
    """Make `dest` this source state's shard folder, or refuse; the writer's lock."""
    if problem := unwritable_reason(dest, create=True):
        raise UsageError(f"--shards {dest} cannot be written ({problem}); pass a folder you "
                         "can write to")
    try:
        lock = try_exclusive(dest / ".lock")
    except NoLocks:
        lock = None  # no flock here: nothing can tell two writers apart
    else:
        if lock is None:
            raise UsageError(f"another train --shards is writing {dest} now; wait for it to "
                             "end, or pass another --shards folder")
    try:
        owner = read_json_file(dest / OWNER)
    except (OSError, ValueError):
        owner = None
    if owner is None:
        others = [p.name for p in dest.iterdir() if p.name != ".lock"]
        if others:
            raise UsageError(f"--shards {dest} holds files that train --shards did not write "
                             f"({sorted(others)[0]}, ...); pass an empty or new folder")
        write_json(dest / OWNER, dict(source=str(source), identity=key))
    elif owner != dict(source=str(source), identity=key):
        raise UsageError(f"--shards {dest} holds the shards of another dataset "
                         f"({owner.get('source')}, as it was then) and {source} is not that; "
                         "pass another --shards folder, or delete this one to write it anew")
    return lock


def write_split(dest: Path, split: str, samples: list, shard_size: int,
                progress: Progress) -> tuple[list[dict], int, list[str]]:
    """The shards of one split: their manifest entries, how many were kept, and the
    stale shards of an earlier write removed."""
    index = dest / index_name(split)
    earlier = ({line.get("shard"): line for line in read_jsonl_records(index)[0]}
               if index.is_file() else {})
    lines = []
    kept = 0
    with open_append(index, binary=True) as journal:
        for number, first in enumerate(range(0, len(samples), shard_size)):
            chunk = [(first + i, path, label) for i, (path, label)
                     in enumerate(samples[first:first + shard_size])]
            name = shard_name(split, number)
            line = earlier.get(name)
            if complete(dest, line, [first, len(chunk)]):
                kept += 1
            else:
                line = write_shard(dest, name, chunk)
                journal.write(json_line(line))
                journal.flush()
                os.fsync(journal.fileno())
            lines.append(line)
            progress.add(len(chunk))
    removed = remove_stale(dest, split, len(lines), earlier)
    return rewrite_index(index, lines), kept, removed


def json_line(line: dict) -> bytes:
    return (json_text(line) + "\n").encode()


def rewrite_index(index: Path, lines: list[dict]) -> list[dict]:
    """The split's index file as readers take it, one line per shard in order (the
    appended lines of an interrupted write gone); the shards' manifest entries, each
    with where its line is."""
    entries = []
    offset = 0
    with replacing(index, durable=True) as file:  # a private temporary, renamed over it
        for line in lines:
            data = json_line(line)
            file.write(data)
            entries.append(dict(name=line["shard"], samples=len(line["samples"]),
                                bytes=line["bytes"], sha256=line["sha256"],
                                index=[offset, len(data)]))
            offset += len(data)
    return entries


def remove_stale(dest: Path, split: str, count: int, recorded: dict) -> list[str]:
    """Remove this split's shards past `count` that an earlier write (another
    --shard-size) left, and only those it can prove it wrote: a name its index file
    lists (`recorded`, the list the writer keeps: every shard it wrote has its line
    there, with its size and sha256), holding those bytes, a regular file of this
    user's own. A shard folder may be a project's, and a file at any other name (DALI's
    `wds2idx` indexes, a member's notes) is never touched; one at a shard's name that the
    index does not prove is named and left. The names removed, for the summary line."""
    removed = []
    for path in sorted(dest.glob(f"{split}-*.tar")):
        if not SHARD_NAME.fullmatch(path.name) or int(path.stem.split("-")[1]) < count:
            continue
        if proven_own(path, recorded.get(path.name)):
            path.unlink()
            removed.append(path.name)
        else:
            logger.warning(f"left {path} in place: it is not a shard this folder's index "
                           f"lists with these bytes ({why_not_own(path)}); no reader opens "
                           "it, remove it if no one needs it")
    return removed


def proven_own(path: Path, line: dict | None) -> bool:
    """Whether `path` is a regular file of this user's (lstat: a link is judged itself,
    never its target) whose bytes are those its index line records. Unlinked after the
    look: only someone who may write the folder could swap it in between, and a name is
    all unlink takes from them."""
    info = path.lstat()
    return (stat.S_ISREG(info.st_mode) and info.st_uid == os.getuid()
            and complete(path.parent, line, line.get("planned") if line else None))


def why_not_own(path: Path) -> str:
    info = path.lstat()
    if not stat.S_ISREG(info.st_mode):
        return mode_kind(info.st_mode)
    if info.st_uid != os.getuid():
        return f"a file of uid {info.st_uid}"
    return "a file the index has no line of, or other bytes"


def complete(dest: Path, line: dict | None, planned: list[int] | None) -> bool:
    """Whether the shard of an index line an earlier run appended holds the `planned`
    images (first position, count) and its bytes still match."""
    try:
        shard = dest / line["shard"]
        return (line["planned"] == planned and line["bytes"] == shard.stat().st_size
                and line["sha256"] == sha256_file(shard))
    except (OSError, KeyError, TypeError):
        return False


def write_shard(dest: Path, name: str, chunk: list) -> dict:
    """One shard, through a private temporary file (workload.files.replacing); its index
    line."""
    rows = []
    with replacing(dest / name, durable=True) as raw:
        with tarfile.open(fileobj=raw, mode="w", format=tarfile.USTAR_FORMAT) as tar:
            for position, path, label in chunk:
                data = readable_image(path)
                if data is not None:
                    rows.append(add_sample(tar, position, path, label, data))
    return dict(shard=name, bytes=(dest / name).stat().st_size,
                sha256=sha256_file(dest / name), samples=rows,
                planned=[chunk[0][0], len(chunk)])


def add_sample(tar: tarfile.TarFile, position: int, path: str, label: int,
               data: bytes) -> list:
    """The image and its class as two members; the index row [key, ext, offset, size,
    class] (offset: where the image's bytes start, after its one 512-byte header)."""
    key = sample_key(position)
    ext = Path(path).suffix.lower().lstrip(".")
    offset = tar.offset + tarfile.BLOCKSIZE
    tar.addfile(member_header(f"{key}.{ext}", len(data)), io.BytesIO(data))
    text = str(label).encode()
    tar.addfile(member_header(f"{key}.cls", len(text)), io.BytesIO(text))
    return [key, ext, offset, len(data), label]


def readable_image(path: str) -> bytes | None:
    """The file's bytes if the shards' reader will take them (a regular file of at most
    MAX_MEMBER_BYTES, decoded whole by the reader's open_rgb: a truncated JPEG or a
    64 Mpixel PNG is refused here, not in the middle of a training), else None with the
    warning the image-folder reader gives: it is left out of the shards."""
    try:
        data = read_regular(path, MAX_MEMBER_BYTES)
        open_rgb(io.BytesIO(data))
        return data
    except UNREADABLE as error:
        bad_file_note(path, error)
        return None
