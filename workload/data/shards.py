"""`--dataset shards --data-dir DIR`: training from the tar shards that `--prepare-data
--shards DIR` wrote (the layout and the checks: shardformat.py).

Start-up reads `manifest.json` alone: no listing of the folder, no file per sample. A
sample is one read of its byte range (its two tar headers and its data) at the offset its
shard's index gives; the headers are checked against the index as they are read, and the
image is decoded and augmented in the DataLoader workers as an image folder's is (the same
transforms), or, with the `dali` backend, handed to DALI to decode (dali.ShardSource).
Each process opens a shard and reads its index when it first needs it.

The order of an epoch is a pure function of (seed, epoch) (`stream_order`): the shards in
a shuffled order make one stream, cut into `lane_count` lanes (a power of two up to
MAX_LANES, from the number of shards alone), each lane walked through a shuffle buffer of
SHUFFLE_BUFFER samples, and the global sequence takes one sample of each lane in turn.
That sequence is dealt round-robin to the ranks (the rule every loader follows,
loaders.deal), so step b's global batch is the same samples at any number of ranks, and
each sample's augmentation is seeded by its place in the sequence, not by the rank. Since
position p comes from lane p % lanes, a rank at a world size W that divides the lane
count reads only the lanes of its remainder mod W, which (bit_reversed) are one stretch of
the stream: about 1/W of the shards, and at most two shards shared with other ranks. At
other world sizes a rank reads the lanes of its remainder mod the largest power of two
dividing W (at 12 ranks, a quarter of the shards; at 3, all of them, one sample in three):
the sequence is kept, and with it exactness at any world size, rather than the shards a
rank opens. Resuming at batch b of an epoch starts the same sequence at b's place:
exactly the samples the uninterrupted run would have read next. Evaluation reads the
manifest's order, cut into the same lanes, unshuffled: each rank reads its own stretch.

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
import math
import os
import random
import tarfile
from pathlib import Path

import torch

from workload.data import shardformat
from workload.data.augment import seeded
from workload.data.datasets import UNREADABLE, open_rgb
from workload.data.loaders import rank_positions, sample_seed
from workload.data.shardformat import (BLOCK, MANIFEST, MAX_CLASS_TEXT, SPLITS, check_member,
                                       damaged, padded, read_index, read_manifest)
from workload.files import open_regular, sha256_file
from workload.logs import logger

SHUFFLE_BUFFER = 1000  # samples in a lane's shuffle buffer: about one shard
MAX_LANES = 64  # the most lanes a split is read in: the most ranks that share no shard
OPEN_SHARDS = 8  # shards a process keeps open at least (a lane's buffer spans about two)
SHARDS_PER_LANE = 3  # shards a process keeps open per lane it reads
_SEED_SPACE = 2**63
_EPOCH_STRIDE = 1_000_003


def lane_count(num_shards: int) -> int:
    """The lanes of a split: the largest power of two up to its number of shards, at most
    MAX_LANES (a function of the data alone, never of the number of ranks)."""
    lanes = 1
    while lanes * 2 <= min(num_shards, MAX_LANES):
        lanes *= 2
    return lanes


def bit_reversed(lane: int, lanes: int) -> int:
    """The segment of the stream that `lane` walks. The lanes a rank reads at a world size
    W that divides `lanes` are those of one remainder mod W, which bit reversal (lanes a
    power of two) maps to W's neighbouring segments: a rank's shards are one stretch of
    the stream, two shards at most shared with its neighbours."""
    bits = lanes.bit_length() - 1
    return int(f"{lane:0{bits}b}"[::-1], 2) if bits else 0


def stream_order(counts: list[int], seed: int, epoch: int, buffer: int = SHUFFLE_BUFFER,
                 shuffle: bool = True) -> list[int]:
    """The epoch's global sequence of sample numbers (numbered in manifest order): the
    shards in a shuffled order make one stream, cut into lane_count() segments of equal
    length (one more for the first lanes); each lane walks its segment through a shuffle
    buffer of its own, and the sequence takes one sample from each lane in turn, so the
    sample at position p comes from lane p % lanes. `shuffle=False` (evaluation): the
    manifest's order, cut and interleaved the same way."""
    rng = random.Random((seed * _EPOCH_STRIDE + epoch) % _SEED_SPACE)
    starts = [end - count for end, count in zip(itertools.accumulate(counts), counts)]
    shards = list(range(len(counts)))
    if shuffle:
        rng.shuffle(shards)
    stream = [s for j in shards for s in range(starts[j], starts[j] + counts[j])]
    lanes = lane_count(len(counts))
    size, extra = divmod(len(stream), lanes)
    walks: list[list[int]] = [[] for _ in range(lanes)]
    cut = 0
    for segment in range(lanes):  # the segments in stream order, each to its lane
        lane = bit_reversed(segment, lanes)  # its own inverse
        length = size + (lane < extra)
        walks[lane] = stream[cut:cut + length]
        cut += length
    if shuffle:
        walks = [buffered(walk, rng, buffer) for walk in walks]
    return [walk[t] for t in range(size + 1) for walk in walks if t < len(walk)]


def buffered(samples: list[int], rng: random.Random, buffer: int) -> list[int]:
    """`samples` through a shuffle buffer of `buffer` samples: each one read replaces a
    random one of the buffer, which goes out; the rest of the buffer shuffled at the end."""
    order = []
    held = []
    for sample in samples:
        if len(held) < buffer:
            held.append(sample)
            continue
        slot = rng.randrange(buffer)
        order.append(held[slot])
        held[slot] = sample
    rng.shuffle(held)
    return order + held


def lanes_read(counts: list[int], world_size: int) -> int:
    """How many lanes one rank reads samples of: lanes / W where W divides the lane count;
    else lanes / the largest power of two dividing W (at 3 ranks: every lane, each rank
    reading one sample in three of them)."""
    lanes = lane_count(len(counts))
    return lanes // math.gcd(lanes, world_size)


class StreamSampler(torch.utils.data.Sampler):
    """This rank's (sample, augmentation seed) pairs; TorchLoader sets `epoch` and `start`
    (in samples) before each pass. The epoch's order is made once per epoch, when it is
    first iterated; its length is known without it."""

    def __init__(self, counts: list[int], seed: int, rank: int, world_size: int, train: bool):
        self.counts = counts
        self.seed = seed
        self.train = train
        self.rank = rank
        self.world_size = world_size
        self.epoch = 0
        self.start = 0
        self._cached: tuple[int, list[int]] | None = None

    def _positions(self) -> range:
        return rank_positions(sum(self.counts), self.rank, self.world_size, self.train)

    def count(self) -> int:
        return len(self._positions())

    def __iter__(self):
        positions = self._positions()[self.start:]
        epoch = self.epoch if self.train else 0  # evaluation: the same order every time
        if self._cached is None or self._cached[0] != epoch:
            self._cached = epoch, stream_order(self.counts, self.seed, epoch,
                                               shuffle=self.train)
        order = self._cached[1]
        if not self.train:
            return ((order[p], 0) for p in positions)
        return ((order[p], sample_seed(self.seed, self.epoch, p)) for p in positions)

    def open_shards(self) -> int:
        """The shards a reader of this rank's samples keeps open: a few per lane it
        reads, so that moving through them opens each shard about once."""
        return max(OPEN_SHARDS, SHARDS_PER_LANE * lanes_read(self.counts, self.world_size))

    def __len__(self) -> int:
        return self.count() - self.start


class ShardSamples(torch.utils.data.Dataset):
    """The samples of one split, read from their shards; items are (sample, seed)."""

    def __init__(self, folder: Path, split: str, entries: list[dict], num_classes: int,
                 transform):
        self.folder = folder
        self.split = split
        self.entries = entries
        self.transform = transform
        self.num_classes = num_classes
        self.open_limit = OPEN_SHARDS  # StreamSampler.open_shards() for the rank's reads
        self.counts = [entry["samples"] for entry in entries]
        self.ends = list(itertools.accumulate(self.counts))  # past each shard's last sample
        # This process's open shards and their indexes, the most recently used last: a
        # rank's reads move forward through the shards of its lanes, so a few per lane
        # stay open, whatever the number of shards (a process may hold only so many
        # files, and an index of 1,000 samples is a quarter of a megabyte in memory).
        self._open_shards: collections.OrderedDict[int, tuple[int, list]] = (
            collections.OrderedDict())

    def __len__(self) -> int:
        return sum(self.counts)

    def _locate(self, sample: int) -> tuple[int, int]:
        j = bisect.bisect_right(self.ends, sample)
        return j, sample - (self.ends[j] - self.counts[j])

    def _open(self, j: int) -> tuple[int, list]:
        if j in self._open_shards:
            self._open_shards.move_to_end(j)
            return self._open_shards[j]
        rows = read_index(self.folder, self.split, self.entries[j])
        name = self.entries[j]["name"]
        try:
            self._open_shards[j] = open_regular(self.folder / name), rows
        except OSError as error:
            raise damaged(self.folder, name, f"it cannot be read: {error.strerror}") from None
        if len(self._open_shards) > self.open_limit:
            os.close(self._open_shards.popitem(last=False)[1][0])
        return self._open_shards[j]

    def __getitem__(self, item: tuple[int, int]) -> tuple[torch.Tensor, int]:
        sample, seed = item
        j, k = self._locate(sample)
        image, label = self.read(j, k)
        return seeded(self.transform, image, seed), label

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


def rank_sampler(samples: ShardSamples, train: bool, seed: int, rank: int,
                 world_size: int) -> StreamSampler:
    """This rank's sampler of a split, its reader keeping open the shards it needs."""
    sampler = StreamSampler(samples.counts, seed, rank, world_size, train)
    samples.open_limit = sampler.open_shards()
    return sampler


def member_data(folder: Path, shard: str, span: bytes, at: int, expected: str,
                size: int | None) -> bytes:
    """The data of the member whose header starts at `at` in `span`, which must be
    `expected` (of `size` bytes, or a class text)."""
    found = plain_member_size(span[at:at + BLOCK], expected)
    if (found is not None and found <= shardformat.MAX_MEMBER_BYTES
            and found == (size if size is not None else min(found, MAX_CLASS_TEXT))):
        data = span[at + BLOCK:at + BLOCK + found]
        if len(data) == found:
            return data
    # Anything else is parsed whole, and check_member names what is wrong with it.
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


OCTAL_DIGITS = frozenset(b"01234567")


def plain_member_size(header: bytes, expected: str) -> int | None:
    """The size of the member whose 512-byte header is `header` if it is the regular file
    `expected` as the writer writes it (shardformat.member_header, ustar): its name,
    type and size fields compared as bytes, which costs a tenth of tarfile's parse of the
    whole header (the reads of a shard would be slower than a folder's open and read of
    each file otherwise). None for anything else, a header of another writer included,
    which the caller parses whole."""
    size = header[124:136]
    if (header[:100] != expected.encode().ljust(100, b"\0") or header[156:157] != b"0"
            or header[345:346] != b"\0" or size[11:] != b"\0"
            or not OCTAL_DIGITS.issuperset(size[:11])):
        return None
    return int(size[:11], 8)


def verify_shards(folder: Path, manifest: dict) -> int:
    """Every shard whole: its sha256, then every tar member against its index (one line
    naming the first shard that fails); the number of shards checked."""
    count = 0
    for split in SPLITS:
        for entry in manifest["splits"][split]["shards"]:
            verify_shard(folder, split, entry)
            count += 1
    return count


def verify_shard(folder: Path, split: str, entry: dict) -> None:
    name = entry["name"]
    path = folder / entry["name"]
    try:
        digest = sha256_file(path)
        size = path.stat().st_size
    except OSError as error:
        raise damaged(folder, name, f"it cannot be read: {error.strerror or error}") from None
    if size != entry["bytes"] or digest != entry["sha256"]:
        raise damaged(folder, name, f"its sha256 is not the one {MANIFEST} records")
    rows = read_index(folder, split, entry)
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
    from workload.data.imagefolder import folder_transforms  # torchvision: seconds

    root = Path(folder).expanduser()
    manifest = read_manifest(root)
    if verify:
        count = verify_shards(root, manifest)
        logger.info(f"{count} shards in {root} verified: their sha256 and every member")
    classes = [str(c) for c in manifest["classes"]]
    splits = [ShardSamples(root, split, manifest["splits"][split]["shards"], len(classes),
                           folder_transforms(image_size, split == "train"))
              for split in SPLITS]
    return splits[0], splits[1], classes
