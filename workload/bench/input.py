"""`bench input`: images/s of every available data backend and of the reference's
per-sample pipeline, on the same data in one process, runs alternating. On an image folder
(decode + augment) the backends are compared with `torch`, such as DALI on the CPU:
    bench input --dataset imagefolder --data-dir $DATA --device cpu --workers 8"""

from __future__ import annotations

import itertools

import torch

from workload.bench.common import config_from, print_table, summarise, timed, write_report
from workload.bench.reference import ReferenceLoader
from workload.data import DataRequest, available, build_data, read_in_memory
from workload.distributed import resolve_device
from workload.errors import UsageError

REFERENCE = "reference"


def chosen_backends(requested: str | None, dataset: str) -> list[str]:
    names = [n for n in ("device", "dali", "torch") if n in available()]
    if dataset == "imagefolder":
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


def build_loader(name: str, cfg, device: torch.device):
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


def compare(results: dict) -> str:
    """Each backend's rate over the baseline's: the reference pipeline for in-memory data,
    the torch DataLoader for image folders. The baseline's name."""
    baseline = REFERENCE if REFERENCE in results else "torch"
    base = results.get(baseline, {}).get("images_per_second")
    for result in results.values():
        result["vs_baseline"] = result["images_per_second"] / base if base else None
        result["vs_reference"] = result["vs_baseline"] if baseline == REFERENCE else None
    return baseline


def run(args: dict) -> dict:
    cfg = config_from(args, batch_size=args.get("batch_size") or 256)
    device = resolve_device(cfg.hardware.device)
    names = chosen_backends(args.get("backends"), cfg.data.dataset)
    loaders = {name: build_loader(name, cfg, device) for name in names}
    rates: dict[str, list[float]] = {name: [] for name in names}
    for round_index in range(args["rounds"]):
        for name in names:  # alternating, so load on a shared machine hits all alike
            rates[name].append(measure(loaders[name], device, args["batches"], round_index))
    results = {name: summarise(r) for name, r in rates.items()}
    baseline = compare(results)
    print_table(["backend", "images/s (median)", f"x {baseline}", "runs"],
                [[n, r["images_per_second"], r["vs_baseline"],
                  " ".join(f"{x:,.0f}" for x in r["runs_images_per_second"])]
                 for n, r in results.items()])
    settings = dict(dataset=cfg.data.dataset, batch_size=cfg.training.batch_size, device=str(device),
                    batches=args["batches"], rounds=args["rounds"], image_size=cfg.data.image_size,
                    workers=cfg.data.workers, torch_threads=torch.get_num_threads(),
                    baseline=baseline)
    write_report(args.get("json"), "input", settings, results)
    return results
