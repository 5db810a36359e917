"""The layout of a shard folder (`train --prepare-data --shards DIR` writes it, `--dataset
shards` reads it), and the checks every reader makes of what it finds there.

A shard folder holds:

- `manifest.json`: the classes, and per split (`train`, `val`) the shards in reading
  order, each with its sample count, size in bytes and sha256, and where its index is;
- `<split>-NNNNNN.tar`: plain (uncompressed, ustar) tar files in the WebDataset layout:
  per sample `<key>.<ext>` (the image file's bytes as they were, its extension in lower
  case) followed by `<key>.cls` (the class number as decimal text); the key is the
  sample's position in the sorted listing of its split, eight digits;
- `index-<split>.jsonl`: one line per shard, in the manifest's order: per sample its key,
  extension, the offset and size of the image's bytes in the tar, and its class, so a
  reader reads one sample without walking the tar. One file per split, not one per shard:
  the point of shards is a thousandth of the files on a parallel file system, and a
  reader takes one shard's line with one read at the place the manifest gives. DALI's own
  `fn.readers.webdataset` takes indexes of its own, which its `wds2idx` tool writes.

Nothing in a shard is trusted for more than a byte range: a reader never unpacks a tar or
follows a name. A member that is not a regular file (a link, a folder), has an absolute
name or `..`, is larger than MAX_MEMBER_BYTES, or is not the member the index names at
that place, stops the run with one line naming the shard (`check_member`).
"""

from __future__ import annotations

import os
import re
import tarfile
from pathlib import Path

from workload.config import FIELDS, MAX_BYTES, out_of_range
from workload.errors import UsageError
from workload.files import open_regular, read_json_file, strict_json

MANIFEST = "manifest.json"
FORMAT = "hpc-train-shards"
FORMAT_VERSION = 2  # 1 kept two index files beside each shard
SPLITS = ("train", "val")
SHARD_NAME = re.compile(r"(train|val)-\d{6}\.tar")
KEY_DIGITS = 8
BLOCK = tarfile.BLOCKSIZE  # 512: a ustar header, and the unit member data is padded to
# The largest member a shard may hold: far above any photograph, far below a size that
# ends a worker under a memory limit when read whole.
MAX_MEMBER_BYTES = 256 << 20
MAX_CLASS_TEXT = 16  # bytes of a .cls member: a decimal class number
# What a manifest and an index may say, checked before anything is read or allocated by
# it: past these a number is damage, not data (else a MemoryError or an OverflowError).
MAX_MANIFEST_BYTES = 256 << 20  # a million shards' entries take about 200 MB
MAX_CLASSES = FIELDS["num_classes"].metadata["bounds"].high  # a model's, as --num-classes
# 7 times ImageNet-21k; each process holds an epoch's order, a list of them.
MAX_SPLIT_SAMPLES = 100_000_000
MAX_ROW_BYTES = 128  # an index row, [key, ext, offset, size, class], takes about 40
INDEX_LINE_BYTES = 1024  # an index line's fields besides its rows take about 200
MAX_OFFSET = MAX_BYTES  # a byte offset in a file, far inside the kernel's off_t


def shard_name(split: str, number: int) -> str:
    return f"{split}-{number:06d}.tar"


def index_name(split: str) -> str:
    """The split's index file: one JSON line per shard."""
    return f"index-{split}.jsonl"


def folder_files(manifest: dict) -> list[str]:
    """The files of a shard folder that its readers use, as its manifest names them: the
    manifest, each split's index and the shards (not the writer's lock and ownership
    record, nor a partial file of a write in progress)."""
    names = [MANIFEST] + [index_name(split) for split in SPLITS]
    for split in SPLITS:
        names += [entry["name"] for entry in manifest["splits"][split]["shards"]]
    return names


def sample_key(position: int) -> str:
    return f"{position:0{KEY_DIGITS}d}"


def member_header(name: str, size: int) -> tarfile.TarInfo:
    """A tar header that depends on nothing but the name and size: no time, owner or mode
    from the source, so the same images always give the same bytes."""
    info = tarfile.TarInfo(name)
    info.size = size
    info.mtime = 0
    info.mode = 0o444
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def padded(size: int) -> int:
    """The bytes a member's data takes in a tar: whole 512-byte blocks."""
    return -(-size // BLOCK) * BLOCK


def check_member(shard: str, member: tarfile.TarInfo, expected: str | None) -> None:
    """One line naming the shard unless `member` is the regular file `expected` of a
    sensible size (None: the index names no more members)."""
    name = member.name
    if name.startswith("/") or ".." in Path(name).parts:
        why = f"the member {name!r} has an absolute name or leads out with '..'"
    elif not member.isreg():
        why = f"the member {name!r} is not a regular file (a link, a folder or a device)"
    elif member.size > MAX_MEMBER_BYTES:
        why = (f"the member {name!r} is {member.size} bytes, more than the "
               f"{MAX_MEMBER_BYTES >> 20} MiB a sample may have")
    elif expected is None:
        why = f"the member {name!r} comes after the last sample its index names"
    elif name != expected:
        why = f"the member {name!r} stands where its index names {expected!r}"
    else:
        return
    raise UsageError(f"shard {shard} is refused: {why}; write the shards again with "
                     "train --dataset imagefolder --data-dir SRC --prepare-data --shards DIR")


def damaged(folder: Path, shard: str, why: str) -> UsageError:
    return UsageError(f"shard {folder / shard} is damaged ({why}); copy it again from where "
                      "the shards were written, or write them again with --prepare-data "
                      "--shards")


def read_manifest(folder: Path) -> dict:
    """The folder's manifest, its shape checked (shard names confined to the folder)."""
    path = folder / MANIFEST
    try:
        manifest = read_json_file(path, MAX_MANIFEST_BYTES)
    except (OSError, ValueError) as error:
        raise UsageError(f"--data-dir {folder} has no readable {MANIFEST} ({error}); a shard "
                         "folder is written by train --dataset imagefolder --data-dir SRC "
                         f"--prepare-data --shards {folder}") from None
    problem = manifest_problem(manifest)
    if problem:
        raise UsageError(f"{path} is not a shard manifest ({problem}); write the shards "
                         "again with --prepare-data --shards")
    return manifest


def manifest_problem(manifest) -> str | None:
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        return f"no \"format\": \"{FORMAT}\""
    if manifest.get("format_version") != FORMAT_VERSION:
        return f"format_version {manifest.get('format_version')!r}, expected {FORMAT_VERSION}"
    classes = manifest.get("classes")
    if not isinstance(classes, list) or not classes:
        return "no classes"
    if len(classes) > MAX_CLASSES:
        return f"{len(classes)} classes, more than the {MAX_CLASSES} a model here may have"
    splits = manifest.get("splits")
    if not isinstance(splits, dict) or set(splits) != set(SPLITS):
        return f"splits must be {', '.join(SPLITS)}"
    for split in SPLITS:
        entries = splits[split].get("shards", []) if isinstance(splits[split], dict) else []
        if not isinstance(entries, list):
            return f"{split}: its shards are not a list"
        for entry in entries:
            if entry_problem(entry, split):
                return f"{split}: {entry_problem(entry, split)}"
        if sum(entry["samples"] for entry in entries) > MAX_SPLIT_SAMPLES:
            return f"{split}: more than the {MAX_SPLIT_SAMPLES:,} samples a split may hold"
    return None


def entry_problem(entry, split: str) -> str | None:
    if not isinstance(entry, dict) or not SHARD_NAME.fullmatch(str(entry.get("name"))):
        return f"a shard entry without a name like {shard_name(split, 0)}"
    if not str(entry["name"]).startswith(split + "-"):
        return f"{entry['name']} listed under {split}"
    for field in ("samples", "bytes"):
        if problem := out_of_range(field, entry.get(field)):
            return f"{entry['name']}: {problem}"
    if not re.fullmatch(r"[0-9a-f]{64}", str(entry.get("sha256"))):
        return f"{entry['name']}: no sha256"
    at = entry.get("index")
    longest = INDEX_LINE_BYTES + entry["samples"] * MAX_ROW_BYTES
    if not (isinstance(at, list) and len(at) == 2
            and all(isinstance(v, int) and v >= 0 for v in at)):
        return f"{entry['name']}: its index is not [offset, length] in {index_name(split)}"
    if at[0] > MAX_OFFSET or at[1] > longest:
        return (f"{entry['name']}: its index line in {index_name(split)} is said to be at "
                f"{at[0]}, {at[1]} bytes long: not where, nor as long as, a line of "
                f"{entry['samples']} samples is")
    return None


def read_index(folder: Path, split: str, entry: dict) -> list[list]:
    """A shard's index rows [key, ext, offset, size, class]: its line of the split's
    index file, read where the manifest's entry says and checked against that entry."""
    name = entry["name"]
    offset, length = entry["index"]
    try:
        with open(open_regular(folder / index_name(split)), "rb") as file:
            line = os.pread(file.fileno(), length, offset)
        index = strict_json(line.decode("utf-8"))
    except (OSError, ValueError) as error:
        raise damaged(folder, name, f"its line of {index_name(split)} cannot be read: "
                                    f"{error}") from None
    rows = index.get("samples") if isinstance(index, dict) else None
    if (not isinstance(rows, list) or len(rows) != entry["samples"]
            or index.get("shard") != name or index.get("sha256") != entry["sha256"]):
        raise damaged(folder, name, f"its line of {index_name(split)} does not match "
                                    f"{MANIFEST}")
    for row in rows:
        if not (isinstance(row, list) and len(row) == 5 and re.fullmatch(r"\d+", str(row[0]))
                and re.fullmatch(r"[a-z0-9]{1,8}", str(row[1]))
                and all(isinstance(v, int) and v >= 0 for v in row[2:])):
            raise damaged(folder, name, f"its index has a malformed row {row!r:.200}")
        if row[3] > MAX_MEMBER_BYTES or row[2] + row[3] > entry["bytes"]:
            raise damaged(folder, name, f"its index puts sample {row[0]} at {row[2]}, "
                                        f"{row[3]} bytes: outside the shard's "
                                        f"{entry['bytes']} bytes")
    return rows
