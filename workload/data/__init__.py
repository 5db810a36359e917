"""Datasets (read into uint8 tensors or image folders) and the loaders that feed training.

`build_data(cfg, device, rank, world_size, local_world_size)` is the one entry point: it
chooses the data backend (`--data-backend`), reads the dataset named by the config and
returns the training and test loaders for this rank, with the backend's name and the
reason for the choice.

The backends by name: `device` and `torch` are always there; `dali` registers itself the
first time the registry is consulted, only if `nvidia.dali` imports (NVIDIA
DeepLearningExamples does the same), so everything else works without DALI and runs that
never ask pay nothing for importing it.

`stage_data` (staging.py) copies the dataset to node-local storage first (`--stage-to`);
`write_shards` (shardwrite.py) packs an image folder into tar shards (`--shards`), which
`--dataset shards` reads (shards.py) through the `torch` or the `dali` backend.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple
from collections.abc import Callable

import torch

from workload.config import DATA_BACKENDS, NATURAL_IMAGE_SIZE, TrainConfig, image_size_of
from workload.data.augment import ArrayImages, Normalizer
from workload.data.cifar import load_cifar100
from workload.data.datasets import (IMAGENET_MEAN, IMAGENET_STD, UNREADABLE, ArrayDataset,
                                    SplitDataset, load_digits, load_synthetic, open_rgb)
from workload.data.loaders import DeviceLoader, TorchLoader
from workload.launch.devices import default_workers
from workload.data.shards import load_shards, rank_sampler
from workload.data.shardwrite import write_shards
from workload.data.staging import stage_data
from workload.errors import UsageError

DALI_INSTALL_HINT = "pip install nvidia-dali-cuda120 (nvidia-dali-cuda130 for CUDA 13)"


@dataclass
class DataBundle:
    train: object  # DeviceLoader | TorchLoader | DaliLoader: len() and batches(epoch, start)
    test: object
    num_classes: int
    num_train_samples: int
    backend: str
    reason: str
    mean: tuple[float, ...] = ()   # the normalisation every split gets (model.json)
    std: tuple[float, ...] = ()
    classes: list[str] | None = None  # class names where the data has them (image folders)


class Loaders(NamedTuple):
    """What a backend builder returns."""
    train: object
    test: object
    num_classes: int
    num_train: int
    normalizer: Normalizer
    classes: list[str] | None = None


@dataclass
class DataRequest:
    """What every backend builder needs: the config and where this process sits."""
    cfg: TrainConfig
    device: torch.device
    rank: int = 0
    world_size: int = 1
    local_world_size: int = 1

    @property
    def image_size(self) -> int:
        return image_size_of(self.cfg)

    @property
    def shard(self) -> dict:
        return dict(seed=self.cfg.training.seed, rank=self.rank, world_size=self.world_size)

    @property
    def workers(self) -> int:
        workers = self.cfg.data.workers
        return workers if workers >= 0 else default_workers(self.local_world_size)


Builder = Callable[[DataRequest], Loaders]
BACKENDS: dict[str, Builder] = {}
_dali_error: str | None = None  # why DALI is unavailable, once we tried


def register(name: str):
    def add(builder: Builder) -> Builder:
        BACKENDS[name] = builder
        return builder
    return add


def load_imagefolder(data_dir: str, image_size: int):
    """workload.data.imagefolder's, imported on first use: torchvision's import takes
    seconds, which runs on in-memory data do without."""
    from workload.data import imagefolder

    return imagefolder.load_imagefolder(data_dir, image_size)


def eval_transform(image_size: int, resize: str):
    """workload.data.imagefolder's (imported on first use, as `load_imagefolder`)."""
    from workload.data import imagefolder

    return imagefolder.eval_transform(image_size, resize)


def read_in_memory(req: DataRequest) -> SplitDataset:
    cfg = req.cfg
    if cfg.data.dataset == "cifar100":
        return load_cifar100(cfg.data.data_dir, cfg.data.download)
    if cfg.data.dataset == "digits":
        return load_digits(req.image_size)
    return load_synthetic(cfg.data.synthetic_size, req.image_size, cfg.data.num_classes)


def _normalizer(req: DataRequest, split: SplitDataset | None) -> Normalizer:
    mean, std = (IMAGENET_MEAN, IMAGENET_STD) if split is None else (split.mean, split.std)
    return Normalizer(mean, std, req.device, req.cfg.hardware.channels_last)


@register("device")
def build_device(req: DataRequest):
    split = read_in_memory(req)
    normalizer = _normalizer(req, split)
    make = lambda data, train: DeviceLoader(data, req.cfg.training.batch_size, req.device,
                                            normalizer, train=train, **req.shard)
    return Loaders(make(split.train, True), make(split.test, False), split.train.num_classes,
                   len(split.train), normalizer)


def build_shards(req: DataRequest) -> Loaders:
    """Shard folders: read by DataLoader workers in the order of shards.StreamSampler."""
    cfg = req.cfg
    train, test, names = load_shards(cfg.data.data_dir, req.image_size,
                                     verify=cfg.data.prepare_data)
    normalizer = _normalizer(req, None)
    make = lambda data, is_train: TorchLoader(
        data, cfg.training.batch_size, req.device, normalizer, train=is_train,
        workers=req.workers, **req.shard,
        sampler=rank_sampler(data, is_train, **req.shard))
    return Loaders(make(train, True), make(test, False), len(names), len(train), normalizer,
                   names)


@register("torch")
def build_torch(req: DataRequest):
    if req.cfg.data.dataset == "shards":
        return build_shards(req)
    if req.cfg.data.dataset == "imagefolder":
        train, test = load_imagefolder(req.cfg.data.data_dir, req.image_size)
        normalizer = _normalizer(req, None)
        classes = len(train.classes)
        names = train.classes
    else:
        split = read_in_memory(req)
        names = None
        train = ArrayImages(split.train, train=True)
        test = ArrayImages(split.test, train=False)
        normalizer = _normalizer(req, split)
        classes = split.train.num_classes
    make = lambda data, is_train: TorchLoader(data, req.cfg.training.batch_size, req.device,
                                              normalizer, train=is_train, workers=req.workers,
                                              **req.shard)
    return Loaders(make(train, True), make(test, False), classes, len(train), normalizer, names)


def build_dali(req: DataRequest):
    from workload.data import dali

    if req.cfg.data.dataset == "shards":
        train, test, names = load_shards(req.cfg.data.data_dir, req.image_size,
                                         verify=req.cfg.data.prepare_data)
        sources = tuple(dali.ShardSource(data, rank_sampler(data, is_train, **req.shard),
                                         req.image_size)
                        for data, is_train in ((train, True), (test, False)))
        normalizer = _normalizer(req, None)
        classes = len(names)
        num_train = len(train)
    elif req.cfg.data.dataset == "imagefolder":
        train, test = load_imagefolder(req.cfg.data.data_dir, req.image_size)
        sources = dali.FileSource(train, req.image_size), dali.FileSource(test, req.image_size)
        normalizer = _normalizer(req, None)
        classes = len(train.classes)
        names = train.classes
        num_train = len(train)
    else:
        split = read_in_memory(req)
        names = None
        sources = dali.ArraySource(split.train), dali.ArraySource(split.test)
        normalizer = _normalizer(req, split)
        classes = split.train.num_classes
        num_train = len(split.train)
    loaders = dali.build_loaders(*sources, req.cfg.training.batch_size, req.device, normalizer,
                                 max(1, req.workers), **req.shard)
    return Loaders(*loaders, classes, num_train, normalizer, names)


def available() -> dict[str, Builder]:
    """The registry, with `dali` in it when nvidia.dali imports."""
    global _dali_error
    if "dali" not in BACKENDS and _dali_error is None:
        try:
            import workload.data.dali  # noqa: F401  (imports nvidia.dali)
        except ImportError as error:
            _dali_error = str(error)
        else:
            BACKENDS["dali"] = build_dali
    return BACKENDS


def choose(requested: str, dataset: str, device: torch.device) -> tuple[str, str]:
    """The backend for this run and the reason, printed at the start of every run."""
    in_memory = dataset not in ("imagefolder", "shards")
    if requested == "device" and not in_memory:
        raise UsageError("--data-backend device needs an in-memory dataset (cifar100, digits, "
                         f"synthetic); {dataset} reads files: use --data-backend auto, torch "
                         "or dali")
    if requested == "dali" and "dali" not in available():
        raise UsageError(f"--data-backend dali needs NVIDIA DALI, which does not import here "
                         f"({_dali_error}); {DALI_INSTALL_HINT}, or use --data-backend auto")
    if requested != "auto":
        return requested, "chosen with --data-backend"
    what = "shards are read and" if dataset == "shards" else "image files are"
    if in_memory:
        return "device", (f"the {dataset} dataset fits in memory: it is augmented in "
                          f"batches on {device.type}")
    if device.type == "cuda" and "dali" in available():
        return "dali", f"{what} decoded on the GPU by NVIDIA DALI"
    if device.type == "cuda":
        return "torch", f"DALI is not installed ({DALI_INSTALL_HINT} decodes on the GPU)"
    return "torch", f"no GPU: {what} decoded by DataLoader worker processes"


def build_data(cfg: TrainConfig, device: torch.device, rank: int = 0, world_size: int = 1,
               local_world_size: int = 1, for_training: bool = True) -> DataBundle:
    """The loaders of both splits for this rank; `for_training` also requires at least one
    training step per epoch (evaluation reads the test split only)."""
    name, reason = choose(cfg.data.data_backend, cfg.data.dataset, device)
    req = DataRequest(cfg, device, rank, world_size, local_world_size)
    # Only DALI's builder needs the registry consulted: importing nvidia.dali costs 1.5 s
    # of CPU at every start, which a run that does not read through DALI need not pay.
    built = (available() if name == "dali" else BACKENDS)[name](req)
    if name == "torch":
        reason += f" ({req.workers} DataLoader workers)"
    if for_training and len(built.train) == 0:
        raise UsageError(no_steps_message(cfg.training.batch_size, built.num_train, world_size))
    return DataBundle(built.train, built.test, built.num_classes, built.num_train, name,
                      reason, built.normalizer.mean, built.normalizer.std,
                      list(built.classes) if built.classes is not None else None)


def no_steps_message(batch_size: int, num_train: int, world_size: int) -> str:
    """Why an epoch would have 0 steps: the batch is larger than a rank's share."""
    share = num_train // world_size
    fix = f"pass --batch-size {share} or less" if share else "use more training images"
    return (f"--batch-size {batch_size} is larger than this process's share of the training "
            f"set ({num_train} images over {world_size} processes: {share} each), so an "
            f"epoch would train 0 steps; {fix}, or run fewer processes")


__all__ = ["DATA_BACKENDS", "NATURAL_IMAGE_SIZE", "ArrayDataset", "DataBundle", "DataRequest",
           "Normalizer", "UNREADABLE", "available", "build_data", "choose", "eval_transform",
           "open_rgb", "read_in_memory", "stage_data", "write_shards"]
