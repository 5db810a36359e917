"""The `dali` data backend: NVIDIA DALI pipelines fed in the shared shard order.

Imported only when `nvidia.dali` imports (workload.data's registry adds it then). The
pipeline runs on the GPU when the training device is CUDA (image files decoded by DALI's
"mixed" GPU decoder) and CPU-only (`device_id=None`) otherwise: the same code either way,
so CI exercises it on the CPU.

Which samples a rank reads is the shared sharding rule, and the flips and crop offsets come
from the shared per-batch seed (workload.data.loaders), so DALI draws the augmentation
distribution of the device backend (on the CPU the very same images) and a resumed run
starts mid-epoch exactly. DALI cuts and mirrors in uint8, a quarter of the bytes of floats;
normalisation is the `Normalizer` every backend shares.

Shard folders (`ShardSource`): the samples are read by shards.ShardSamples (each one's
byte range, its tar headers checked) in the order of a shards.StreamSampler, the same
order as the torch backend's, and DALI decodes them; their classes come with them.

Why not DALI's own `fn.readers.webdataset` (tried with nvidia-dali 2.4's CPU pipeline on
shards written here, indexed by DALI's `wds2idx`): it reads them, and its reader checkpoint
(`enable_checkpointing`) restores a pipeline mid-epoch exactly, but only at the number of
ranks it was taken at. Its ranks (`shard_id` of `num_shards`) read contiguous ranges of
the samples in the shards' file order, so the global batches of 2 ranks are other
samples than those 1 rank reads in its first steps; its shuffle is a buffer of its own
that takes no per-epoch shard order (the paths are fixed when the pipeline is built) and
no lanes; and a rank's order cannot be set per sample to follow ours. Reading through it
would lose the one global sequence per (seed, epoch) at any number of ranks, so the
shards are read here and fed to DALI (tests/e2e/test_data_backends.py holds both facts).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import nvidia.dali.fn as fn
import nvidia.dali.types as types
import torch
from nvidia.dali import pipeline_def
from nvidia.dali.plugin.pytorch import feed_ndarray

from workload.data.augment import PADDING, Normalizer, batch_work_threads, draw_flips_and_offsets
from workload.data.datasets import ArrayDataset
from workload.data.loaders import ShardedBatches, batch_seed, batch_slice, num_batches
from workload.data.shardformat import MAX_MEMBER_BYTES
from workload.errors import UsageError
from workload.files import read_regular

# RandomResizedCrop's defaults, as the torch backend uses for image folders.
RANDOM_AREA = (0.08, 1.0)
RANDOM_ASPECT = (3 / 4, 4 / 3)


def _to_chw_uint8(images, mirror=None):
    # crop_mirror_normalize with mean 0, std 1 and a uint8 output: mirror + HWC -> CHW only.
    extra = {} if mirror is None else {"mirror": mirror}
    return fn.crop_mirror_normalize(images, dtype=types.UINT8, output_layout="CHW",
                                    mean=[0.0], std=[1.0], **extra)


@pipeline_def
def array_pipeline(image_size: int, train: bool, on_gpu: bool):
    """uint8 HWC images in; zero-padded random crops at the given anchors, mirrored, out."""
    images = fn.external_source(name="images", layout="HWC", dtype=types.UINT8)
    if on_gpu:
        images = images.gpu()
    if not train:
        return _to_chw_uint8(images)
    anchor = fn.external_source(name="anchor", dtype=types.INT32)
    mirror = fn.external_source(name="mirror", dtype=types.INT32)
    # A window of the image's size at anchor - padding; outside the image reads zeros:
    # the same as padding by 4 and cropping at the anchor.
    images = fn.slice(images, anchor, np.array([image_size, image_size], dtype=np.int32),
                      axes=[0, 1], out_of_bounds_policy="pad", fill_values=0)
    return _to_chw_uint8(images, mirror)


@pipeline_def
def file_pipeline(image_size: int, train: bool, on_gpu: bool):
    """Encoded image files in (JPEG, PNG, ...); decoded, cropped, resized, mirrored, out."""
    encoded = fn.external_source(name="encoded", dtype=types.UINT8)
    decoder = "mixed" if on_gpu else "cpu"
    if not train:
        images = fn.decoders.image(encoded, device=decoder, output_type=types.RGB)
        images = fn.resize(images, resize_shorter=image_size * 8 // 7)
        return fn.crop_mirror_normalize(images, crop=(image_size, image_size),
                                        dtype=types.UINT8, output_layout="CHW",
                                        mean=[0.0], std=[1.0])
    mirror = fn.external_source(name="mirror", dtype=types.INT32)
    # The crop box comes from DALI's generator (seeded per rank): it needs the image's
    # shape, known only while decoding. The flips follow the shared per-batch seed.
    images = fn.decoders.image_random_crop(encoded, device=decoder, output_type=types.RGB,
                                           random_area=list(RANDOM_AREA),
                                           random_aspect_ratio=list(RANDOM_ASPECT))
    images = fn.resize(images, resize_x=image_size, resize_y=image_size)
    return _to_chw_uint8(images, mirror)


class ArraySource:
    """In-memory uint8 images: the inputs of one batch for `array_pipeline`."""

    pipeline = staticmethod(array_pipeline)

    def __init__(self, data: ArrayDataset):
        self.hwc = np.ascontiguousarray(data.images.permute(0, 2, 3, 1).numpy())
        self.labels = data.labels
        self.image_size = data.images.shape[-1]

    def inputs(self, idx: np.ndarray, generator: torch.Generator | None) -> dict:
        feed = {"images": self.hwc[idx]}
        if generator is not None:
            flip, dy, dx = draw_flips_and_offsets(len(idx), PADDING, generator, torch.device("cpu"))
            # The device backend flips, then crops at dx; cropping first at the mirrored
            # offset and flipping afterwards gives the same pixels.
            dx = torch.where(flip, 2 * PADDING - dx, dx)
            anchor = torch.stack([dy, dx], 1) - PADDING
            feed.update(anchor=anchor.int().numpy(), mirror=flip.int().numpy())
        return feed


class FileSource:
    """Image files listed by a torchvision ImageFolder: encoded bytes for `file_pipeline`."""

    pipeline = staticmethod(file_pipeline)

    def __init__(self, folder, image_size: int):
        self.paths = [path for path, _ in folder.samples]
        self.labels = torch.tensor([label for _, label in folder.samples])
        self.image_size = image_size

    def inputs(self, idx: np.ndarray, generator: torch.Generator | None) -> dict:
        feed = {"encoded": [encoded_file(self.paths[i]) for i in idx]}
        if generator is not None:
            flip, _, _ = draw_flips_and_offsets(len(idx), PADDING, generator, torch.device("cpu"))
            feed["mirror"] = flip.int().numpy()
        return feed


def encoded_file(path: str) -> np.ndarray:
    """An image file's bytes, read as every reader of a walked folder reads
    (files.read_regular, at most a shard member's bound): a FIFO or a device put in
    place of a listed file is one line, where reading it waited forever."""
    try:
        return np.frombuffer(read_regular(Path(path), MAX_MEMBER_BYTES), dtype=np.uint8)
    except OSError as error:
        why = error.strerror or str(error)
        why = why if path in why else f"{path}: {why}"
        raise UsageError(f"--data-backend dali cannot read an image file ({why}); remove it "
                         "from the image folder, or train with --data-backend torch, which "
                         "skips files it cannot read") from None


class ShardSource:
    """Samples of a shard folder (shards.ShardSamples) in the order of a
    shards.StreamSampler: encoded bytes for `file_pipeline`, the classes read with them."""

    pipeline = staticmethod(file_pipeline)

    def __init__(self, samples, sampler, image_size: int):
        self.samples = samples
        self.sampler = sampler
        self.image_size = image_size
        self.read_labels: list[torch.Tensor] = []  # of the batches scheduled, oldest first

    def inputs(self, idx: np.ndarray, generator: torch.Generator | None) -> dict:
        read = [self.samples.encoded(int(i)) for i in idx]
        self.read_labels.append(torch.tensor([label for _, label in read]))
        feed = {"encoded": [np.frombuffer(data, dtype=np.uint8) for data, _ in read]}
        if generator is not None:
            flip, _, _ = draw_flips_and_offsets(len(idx), PADDING, generator, torch.device("cpu"))
            feed["mirror"] = flip.int().numpy()
        return feed


def _to_torch(tensor_list, device: torch.device) -> torch.Tensor:
    dense = tensor_list.as_tensor()
    out = torch.empty(dense.shape(), dtype=torch.uint8, device=device)
    stream = torch.cuda.current_stream(device) if device.type == "cuda" else None
    feed_ndarray(dense, out, cuda_stream=stream)
    return out


class DaliLoader(ShardedBatches):
    """`len(loader)` and `loader.batches(epoch, start)`, like every loader, through DALI.

    One batch is scheduled ahead: DALI prepares batch b + 1 in its threads (or on the GPU)
    while the trainer computes on batch b.
    """

    def __init__(self, source, batch_size: int, device: torch.device, normalizer: Normalizer,
                 *, train: bool, seed: int = 0, rank: int = 0, world_size: int = 1,
                 threads: int = 1):
        self.source = source
        self.batch_size = batch_size
        self.device = device
        self.normalize = normalizer
        self.train = train
        self.seed = seed
        self.rank = rank
        self.world_size = world_size
        self.labels = source.labels.to(device) if hasattr(source, "labels") else None
        on_gpu = device.type == "cuda"
        device_id = (device.index or 0) if on_gpu else None  # None: DALI without a GPU
        self.pipe = source.pipeline(
            source.image_size, train, on_gpu, batch_size=batch_size, num_threads=max(1, threads),
            device_id=device_id, prefetch_queue_depth=1,
            seed=batch_seed(seed, 0, rank, 0) % 2**31)
        self.pipe.build()
        self.pending = 0  # batches scheduled but not collected

    def _schedule(self, epoch: int, b: int, indices: np.ndarray) -> None:
        idx = batch_slice(indices, b, self.batch_size)
        generator = None
        if self.train:
            generator = torch.Generator().manual_seed(batch_seed(self.seed, epoch, self.rank, b))
        for name, value in self.source.inputs(idx, generator).items():
            self.pipe.feed_input(name, value)
        self.pipe.schedule_run()
        self.pending += 1

    def _labels(self, indices: np.ndarray, b: int) -> torch.Tensor:
        idx = torch.from_numpy(batch_slice(indices, b, self.batch_size))
        return self.labels[idx.to(self.device)]

    def _collect(self) -> torch.Tensor:
        (images,) = self.pipe.outputs()
        self.pending -= 1
        return _to_torch(images, self.device)

    def batches(self, epoch: int, start: int = 0) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        indices = self._indices(epoch).numpy()
        count = len(self)
        if start >= count:
            return
        self._schedule(epoch, start, indices)
        try:
            for b in range(start, count):
                images = self._collect()
                if b + 1 < count:
                    self._schedule(epoch, b + 1, indices)
                with batch_work_threads(self.device):
                    images = self.normalize(images)
                yield images, self._labels(indices, b)
        finally:
            while self.pending:  # a loop that stopped early must not leave stale batches
                self._collect()


class ShardDaliLoader(DaliLoader):
    """DaliLoader over a ShardSource: the shard order (shards.StreamSampler) and the
    classes read from the shards with the images."""

    def _indices(self, epoch: int) -> torch.Tensor:
        sampler = self.source.sampler
        sampler.epoch = epoch
        sampler.start = 0
        return torch.tensor([sample for sample, _ in sampler], dtype=torch.int64)

    def __len__(self) -> int:
        return num_batches(self.source.sampler.count(), self.batch_size, self.train)

    def _labels(self, indices: np.ndarray, b: int) -> torch.Tensor:
        return self.source.read_labels.pop(0).to(self.device)

    def batches(self, epoch: int, start: int = 0) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        self.source.read_labels.clear()  # those of a pass that stopped early
        yield from super().batches(epoch, start)


def build_loaders(train_source, test_source, batch_size: int, device: torch.device,
                  normalizer: Normalizer, threads: int, **shard) -> tuple[DaliLoader, DaliLoader]:
    def make(source, train):
        kind = ShardDaliLoader if isinstance(source, ShardSource) else DaliLoader
        return kind(source, batch_size, device, normalizer, train=train, threads=threads,
                    **shard)
    return make(train_source, True), make(test_source, False)
