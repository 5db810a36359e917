"""`--dataset shards --data-dir DIR`: training from the tar shards that `--prepare-data
--shards DIR` wrote (the layout and the checks: shardformat.py).

Start-up reads `manifest.json` alone: no listing of the folder, no file per sample. A
sample is one read of its byte range (its two tar headers and its data) at the offset its
shard's index gives; the headers are checked against the index as they are read, and the
image is decoded and augmented in the DataLoader workers as an image folder's is (the same
transforms), or, with the `dali` backend, handed to DALI to decode (dali.ShardSource).
Each process opens a shard and reads its index when it first needs it.

The order of an epoch is a pure function of (seed, epoch) (`stream_order`): the shards in
a shuffled order, their samples through a shuffle buffer of SHUFFLE_BUFFER samples. That
global sequence is dealt round-robin to the ranks (the rule every loader follows,
loaders.deal), so step b's global batch is the same samples at any number of ranks, and
each sample's augmentation is seeded by its place in the sequence, not by the rank. A
rank reads only its own samples; as the buffer is a window of about two shards, its reads
move forward through the shards. Resuming at batch b of an epoch starts the same sequence
at b's place: exactly the samples the uninterrupted run would have read next.

Hashing every shard costs a full read of the data, which training does not pay at every
start: the sha256 of each shard is checked when it is written (and when a write is
resumed), and by `train --dataset shards --data-dir DIR --prepare-data`, which checks
every shard whole (hash, then every tar header against the index) and is the step to run
after copying shards to where jobs read them. Training itself checks every header it
reads, so a shard changed after that still cannot hand over another member.
"""

from __future__ import annotations

import bisect
import collections
import io
import itertools
import os
import random
import tarfile
from pathlib import Path

import torch

from workload.data.datasets import UNREADABLE, folder_transforms, open_rgb
from workload.data.shardformat import (BLOCK, MANIFEST, MAX_CLASS_TEXT, SPLITS, check_member,
                                       damaged, padded, read_index, read_manifest)
from workload.files import sha256_file
from workload.logs import logger

SHUFFLE_BUFFER = 1000  # samples in the shuffle buffer: about one shard
OPEN_SHARDS = 8  # shards a process keeps open (the buffer spans about two)
_SEED_SPACE = 2**63
_EPOCH_STRIDE = 1_000_003
_POSITION_STRIDE = 1_000_000_007  # more samples than any epoch holds


def stream_order(counts: list[int], seed: int, epoch: int,
                 buffer: int = SHUFFLE_BUFFER) -> list[int]:
    """The epoch's global sequence of sample numbers (numbered in manifest order)."""
    rng = random.Random((seed * _EPOCH_STRIDE + epoch) % _SEED_SPACE)
    starts = [end - count for end, count in zip(itertools.accumulate(counts), counts)]
    shards = list(range(len(counts)))
    rng.shuffle(shards)
    order, held = [], []
    for j in shards:
        for sample in range(starts[j], starts[j] + counts[j]):
            if len(held) < buffer:
                held.append(sample)
                continue
            slot = rng.randrange(buffer)
            order.append(held[slot])
            held[slot] = sample
    rng.shuffle(held)
    return order + held


def sample_seed(seed: int, epoch: int, position: int) -> int:
    """The augmentation seed of the sample at `position` of an epoch's global sequence."""
    return ((seed * _EPOCH_STRIDE + epoch) * _POSITION_STRIDE + position) % _SEED_SPACE


class StreamSampler(torch.utils.data.Sampler):
    """This rank's (sample, augmentation seed) pairs; TorchLoader sets `epoch` and `start`
    (in samples) before each pass. The epoch's order is made once per epoch, when it is
    first iterated; its length is known without it."""

    def __init__(self, counts: list[int], seed: int, rank: int, world_size: int, train: bool):
        self.counts, self.seed, self.train = counts, seed, train
        self.rank, self.world_size = rank, world_size
        self.epoch, self.start = 0, 0
        self._cached: tuple[int, list[int]] | None = None

    def _positions(self) -> range:
        """This rank's places in the epoch's global sequence: the rule of loaders.deal
        (training) and loaders.eval_shard (evaluation), as a range, since its length is
        asked at every step."""
        total = sum(self.counts)
        if not self.train:
            return range(self.rank, total, self.world_size)
        return range(self.rank, total // self.world_size * self.world_size, self.world_size)

    def count(self) -> int:
        return len(self._positions())

    def __iter__(self):
        positions = self._positions()[self.start:]
        if not self.train:
            return ((p, 0) for p in positions)
        if self._cached is None or self._cached[0] != self.epoch:
            self._cached = self.epoch, stream_order(self.counts, self.seed, self.epoch)
        order = self._cached[1]
        return ((order[p], sample_seed(self.seed, self.epoch, p)) for p in positions)

    def __len__(self) -> int:
        return self.count() - self.start


class ShardSamples(torch.utils.data.Dataset):
    """The samples of one split, read from their shards; items are (sample, seed)."""

    def __init__(self, folder: Path, entries: list[dict], num_classes: int, transform):
        self.folder, self.entries, self.transform = folder, entries, transform
        self.num_classes = num_classes
        self.counts = [entry["samples"] for entry in entries]
        self.ends = list(itertools.accumulate(self.counts))  # past each shard's last sample
        # This process's open shards and their indexes, the most recently used last: a
        # rank's reads move forward through the shards, so a few stay open, whatever the
        # number of shards (a process may hold only so many files, and an index of 1,000
        # samples is a quarter of a megabyte in memory).
        self._open_shards: collections.OrderedDict[int, tuple[int, list]] = \
            collections.OrderedDict()

    def __len__(self) -> int:
        return sum(self.counts)

    def _locate(self, sample: int) -> tuple[int, int]:
        j = bisect.bisect_right(self.ends, sample)
        return j, sample - (self.ends[j] - self.counts[j])

    def _open(self, j: int) -> tuple[int, list]:
        if j in self._open_shards:
            self._open_shards.move_to_end(j)
            return self._open_shards[j]
        rows = read_index(self.folder, self.entries[j])
        self._open_shards[j] = os.open(self.folder / self.entries[j]["name"], os.O_RDONLY), rows
        if len(self._open_shards) > OPEN_SHARDS:
            os.close(self._open_shards.popitem(last=False)[1][0])
        return self._open_shards[j]

    def __getitem__(self, item: tuple[int, int]) -> tuple[torch.Tensor, int]:
        sample, seed = item
        j, k = self._locate(sample)
        image, label = self.read(j, k)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            return self.transform(image), label

    def encoded(self, sample: int) -> tuple[bytes, int]:
        """A sample's image file bytes, its headers checked, and its class."""
        return self.raw(*self._locate(sample))[:2]

    def raw(self, j: int, k: int) -> tuple[bytes, int, str, str]:
        """Sample k of shard j, its headers checked: image bytes, class, key, shard."""
        fd, rows = self._open(j)
        key, ext, offset, size, label = rows[k]
        name = self.entries[j]["name"]
        span = os.pread(fd, BLOCK + padded(size) + 2 * BLOCK, max(offset - BLOCK, 0))
        data = member_data(self.folder, name, span, 0, f"{key}.{ext}", size)
        text = member_data(self.folder, name, span, BLOCK + padded(size), f"{key}.cls", None)
        if text.strip() != str(label).encode() or label >= self.num_classes:
            raise damaged(self.folder, name, f"sample {key}'s class is not the index's")
        return data, label, key, name

    def read(self, j: int, k: int):
        """Sample k of shard j: its image decoded, and its class."""
        data, label, key, name = self.raw(j, k)
        try:
            return open_rgb(io.BytesIO(data)), label
        except UNREADABLE as error:
            why = str(error).strip() or type(error).__name__
            raise damaged(self.folder, name, f"sample {key} is not a readable image: "
                                             f"{why}") from None


def member_data(folder: Path, shard: str, span: bytes, at: int, expected: str,
                size: int | None) -> bytes:
    """The data of the member whose header starts at `at` in `span`, which must be
    `expected` (of `size` bytes, or a class text)."""
    try:
        member = tarfile.TarInfo.frombuf(span[at:at + BLOCK], tarfile.ENCODING,
                                         "surrogateescape")
    except tarfile.HeaderError as error:
        raise damaged(folder, shard, f"a tar header where {expected} should be is "
                                     f"unreadable: {error}") from None
    check_member(shard, member, expected)
    if member.size != size and (size is not None or member.size > MAX_CLASS_TEXT):
        raise damaged(folder, shard, f"{expected} is {member.size} bytes, not as indexed")
    data = span[at + BLOCK:at + BLOCK + member.size]
    if len(data) != member.size:
        raise damaged(folder, shard, f"it ends inside {expected}")
    return data


def verify_shards(folder: Path, manifest: dict) -> int:
    """Every shard whole: its sha256, then every tar member against its index (one line
    naming the first shard that fails); the number of shards checked."""
    count = 0
    for split in SPLITS:
        for entry in manifest["splits"][split]["shards"]:
            verify_shard(folder, entry)
            count += 1
    return count


def verify_shard(folder: Path, entry: dict) -> None:
    name, path = entry["name"], folder / entry["name"]
    try:
        digest, size = sha256_file(path), path.stat().st_size
    except OSError as error:
        raise damaged(folder, name, f"it cannot be read: {error.strerror or error}") from None
    if size != entry["bytes"] or digest != entry["sha256"]:
        raise damaged(folder, name, f"its sha256 is not the one {MANIFEST} records")
    rows = read_index(folder, entry)
    expected: list[tuple[str, int | None]] = []
    for key, ext, offset, _, _ in rows:
        expected += [(f"{key}.{ext}", offset), (f"{key}.cls", None)]
    with tarfile.open(path, "r:") as tar:
        members = iter(tar)
        for want, offset in expected:
            member = next(members, None)
            if member is None:
                raise damaged(folder, name, f"it ends before {want}")
            check_member(name, member, want)
            if offset is not None and member.offset_data != offset:
                raise damaged(folder, name, f"{want} is not where its index says")
        extra = next(members, None)
        if extra is not None:
            check_member(name, extra, None)


def load_shards(folder: str, image_size: int, verify: bool = False):
    """The train and val splits of a shard folder, and the class names; `verify`: check
    every shard whole first (--prepare-data)."""
    root = Path(folder).expanduser()
    manifest = read_manifest(root)
    if verify:
        count = verify_shards(root, manifest)
        logger.info(f"{count} shards in {root} verified: their sha256 and every member")
    classes = [str(c) for c in manifest["classes"]]
    splits = [ShardSamples(root, manifest["splits"][split]["shards"], len(classes),
                           folder_transforms(image_size, split == "train"))
              for split in SPLITS]
    return splits[0], splits[1], classes
