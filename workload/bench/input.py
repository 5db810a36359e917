"""`bench input`: images/s of every available data backend and of the reference's
per-sample pipeline, on the same data in one process, runs alternating. On an image folder
(decode + augment) the backends are compared with `torch`, such as DALI on the CPU:
    bench input --dataset imagefolder --data-dir $DATA --device cpu --workers 8
    bench input --dataset shards --data-dir $SHARDS --device cpu --workers 8

Shards against the image folder they were written from, read by each backend, both also
staged as `train --stage-to` stages them; the baseline is the folder read by `torch`:
    bench input --dataset shards --data-dir $SHARDS --versus-folder $DATA --stage-to $TMPDIR
With --read-only, the images are read and not decoded (one process, one thread): what
the file system and the format cost, which decoding hides on a busy CPU.

The reference is the Olivia guide's workload, as the baseline: exactly what its
dataset_utils.py and train_utils.py do, one PIL image at a time through
RandomHorizontalFlip, RandomCrop(32, padding=4), ToTensor and Normalize in a DataLoader
with num_workers=0; its plain fp32 step is `bench train`'s reference_step.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import torch
import torchvision.transforms as transforms
from PIL import Image

from workload.bench.common import (bench_process, config_from, print_table, summarise, timed,
                                   write_report)
from workload.data import (ArrayDataset, DataRequest, available, build_data, read_in_memory,
                           stage_data)
from workload.data.imagefolder import load_imagefolder
from workload.data.loaders import ShardSampler
from workload.data.shardformat import SPLITS, folder_files, read_manifest
from workload.data.shards import load_shards, rank_sampler
from workload.data.stagefiles import listing
from workload.errors import UsageError
from workload.launch import PreemptionFlag

REFERENCE = "reference"
READ = "read"  # the encoded images read alone, no decoding (--read-only)


class ReferenceImages(torch.utils.data.Dataset):
    """uint8 arrays served as torchvision's CIFAR100 serves them: a PIL image per sample."""

    def __init__(self, data: ArrayDataset, mean, std):
        self.hwc = data.images.permute(0, 2, 3, 1).contiguous().numpy()
        self.labels = data.labels.tolist()
        self.transform = transforms.Compose([
            transforms.RandomHorizontalFlip(),
            transforms.RandomCrop(data.images.shape[-1], padding=4),
            transforms.ToTensor(),
            transforms.Normalize(mean, std),
        ])

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int):
        return self.transform(Image.fromarray(self.hwc[index])), self.labels[index]


class ReferenceLoader:
    """The guide's DataLoader, with the interface of the project's loaders."""

    def __init__(self, data: ArrayDataset, mean, std, batch_size: int, device: torch.device):
        self.device = device
        self.loader = torch.utils.data.DataLoader(
            ReferenceImages(data, mean, std), batch_size=batch_size, shuffle=True,
            drop_last=True, num_workers=0, pin_memory=device.type == "cuda")

    def __len__(self) -> int:
        return len(self.loader)

    def batches(self, epoch: int, start: int = 0) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for images, labels in self.loader:
            yield images.to(self.device), labels.to(self.device)


class EncodedReader:
    """Batches of the training split's encoded images, read in rank 0 of 1's order of an
    epoch in this process, undecoded: what reading the files costs, alone."""

    def __init__(self, cfg):
        seed = cfg.training.seed
        self.batch_size = cfg.training.batch_size
        if cfg.data.dataset == "shards":
            train = load_shards(cfg.data.data_dir, 32)[0]
            self.sampler = rank_sampler(train, True, seed, 0, 1)
            self.read = lambda item: train.encoded(item[0])
        else:
            paths = [path for path, _ in load_imagefolder(cfg.data.data_dir, 32)[0].samples]
            self.sampler = ShardSampler(len(paths), seed, 0, 1, True)
            self.read = lambda item: Path(paths[item[0]]).read_bytes()

    def __len__(self) -> int:
        return self.sampler.count() // self.batch_size

    def batches(self, epoch: int, start: int = 0):
        self.sampler.epoch = epoch
        self.sampler.start = start * self.batch_size
        items = iter(self.sampler)
        for _ in range(start, len(self)):
            yield [self.read(item) for item in itertools.islice(items, self.batch_size)], None


def chosen_backends(requested: str | None, dataset: str, read_only: bool = False) -> list[str]:
    if read_only:
        return [READ]
    names = [n for n in ("device", "dali", "torch") if n in available()]
    if dataset in ("imagefolder", "shards"):
        names.remove("device")  # only for in-memory datasets
    else:
        names.append(REFERENCE)
    if not requested:
        return names
    wanted = [n.strip() for n in requested.split(",") if n.strip()]
    for name in wanted:
        if name not in names:
            raise UsageError(f"--backends: {name!r} cannot run here; available for "
                             f"{dataset}: {', '.join(names)}")
    return wanted


def data_cases(args: dict, cfg, info) -> dict[str, object]:
    """The data read, by label: --data-dir (label '' alone); with --versus-folder
    ('shards' and) the image folder; with --stage-to each also staged, by train's own
    staging (stage_data: one copy per state of the source, reused by later runs)."""
    versus = args.get("versus_folder")
    found = {"shards" if versus else "": cfg.replace(stage_to="")}
    if versus:
        found["folder"] = cfg.replace(dataset="imagefolder", data_dir=versus, stage_to="")
    if cfg.data.stage_to:
        for label, case in list(found.items()):
            staged = stage_data(case.replace(stage_to=cfg.data.stage_to), info)
            found[f"staged {label}".strip()] = case.replace(data_dir=staged)
    return found


def file_counts(cases: dict) -> dict[str, int]:
    """The files each kind of data holds: what the shared file system sees."""
    counts = {}
    for label, case in cases.items():
        root = Path(case.data.data_dir)
        if case.data.dataset == "shards":
            counts[label or "shards"] = len(folder_files(read_manifest(root)))
        elif case.data.dataset == "imagefolder":
            counts[label or "folder"] = len(listing(root))
    return counts


def check_same_images(cases: dict) -> None:
    """--versus-folder must be the image folder the shards hold: the same image count."""
    if "folder" not in cases:
        return
    manifest = read_manifest(Path(cases["shards"].data.data_dir))
    in_shards = sum(manifest["splits"][split]["samples"] for split in SPLITS)
    train, val = load_imagefolder(cases["folder"].data.data_dir, 32)
    in_folder = len(train.samples) + len(val.samples)
    if in_folder != in_shards:
        raise UsageError(f"--versus-folder {cases['folder'].data.data_dir} holds {in_folder} "
                         f"images and the shards {in_shards}; pass the image folder the "
                         "shards were written from")


def build_loader(name: str, cfg, device: torch.device):
    if name == READ:
        return EncodedReader(cfg)
    if name == REFERENCE:
        split = read_in_memory(DataRequest(cfg, device))
        return ReferenceLoader(split.train, split.mean, split.std, cfg.training.batch_size, device)
    return build_data(cfg.replace(data_backend=name), device).train


def endless(loader, first_epoch: int):
    """Batches across epoch boundaries, so a run may be longer than one epoch."""
    for epoch in itertools.count(first_epoch):
        yield from loader.batches(epoch)


def measure(loader, device: torch.device, batches: int, round_index: int) -> float:
    """Images/s over `batches` batches; the first batch (worker start-up) is left out."""
    stream = endless(loader, round_index)
    next(stream)
    count = 0

    def consume():
        nonlocal count
        for images, _ in itertools.islice(stream, batches):
            count += len(images)

    seconds = timed(device, consume)
    stream.close()
    return count / seconds


def compare(results: dict, baseline: str | None = None) -> str:
    """Each backend's rate over the baseline's: the reference pipeline for in-memory data,
    the torch DataLoader for image folders and shards (or `baseline`). Its name."""
    baseline = baseline or (REFERENCE if REFERENCE in results else "torch")
    base = results.get(baseline, {}).get("images_per_second")
    for result in results.values():
        result["vs_baseline"] = result["images_per_second"] / base if base else None
        result["vs_reference"] = result["vs_baseline"] if baseline == REFERENCE else None
    return baseline


def run(args: dict, flag: PreemptionFlag) -> dict:
    cfg = config_from(args, batch_size=args.get("batch_size") or 256)
    with bench_process(args, cfg, flag) as info:
        return measure_backends(args, cfg, info)


def measure_backends(args: dict, cfg, info) -> dict:
    device = info.device
    names = chosen_backends(args.get("backends"), cfg.data.dataset, args.get("read_only"))
    cases = data_cases(args, cfg, info)
    check_same_images(cases)
    loaders = {f"{label} {name}".strip(): build_loader(name, case, device)
               for label, case in cases.items() for name in names}
    rates: dict[str, list[float]] = {row: [] for row in loaders}
    for round_index in range(args["rounds"]):
        for row, loader in loaders.items():  # alternating: load on a shared machine
            rates[row].append(measure(loader, device, args["batches"], round_index))
    results = {row: summarise(r) for row, r in rates.items()}
    baseline = compare(results, f"folder {names[-1]}" if "folder" in cases
                       else READ if names == [READ] else None)
    print_table(["backend", "images/s (median)", f"x {baseline}", "runs"],
                [[n, r["images_per_second"], r["vs_baseline"],
                  " ".join(f"{x:,.0f}" for x in r["runs_images_per_second"])]
                 for n, r in results.items()])
    settings = dict(dataset=cfg.data.dataset, batch_size=cfg.training.batch_size,
                    device=str(device),
                    batches=args["batches"], rounds=args["rounds"], image_size=cfg.data.image_size,
                    workers=cfg.data.workers, torch_threads=torch.get_num_threads(),
                    baseline=baseline, files=file_counts(cases),
                    read_only=bool(args.get("read_only")))
    for label, count in settings["files"].items():
        print(f"{label}: {count:,} files")
    write_report(args.get("json"), "input", settings, results)
    return results
