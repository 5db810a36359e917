"""`bench input`: images/s of every available data backend and of the reference's
per-sample pipeline, on the same data in one process, runs alternating."""

from __future__ import annotations

import itertools

import torch

from workload.bench.common import config_from, print_table, summarise, timed, write_report
from workload.bench.reference import ReferenceLoader
from workload.data import build_data
from workload.data.backends import DataRequest, available, read_in_memory
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
    base = results.get(REFERENCE, {}).get("images_per_second")
    for result in results.values():
        result["vs_reference"] = result["images_per_second"] / base if base else None
    print_table(["backend", "images/s (median)", "x reference", "runs"],
                [[n, r["images_per_second"], r["vs_reference"],
                  " ".join(f"{x:,.0f}" for x in r["runs_images_per_second"])]
                 for n, r in results.items()])
    settings = dict(dataset=cfg.data.dataset, batch_size=cfg.training.batch_size, device=str(device),
                    batches=args["batches"], rounds=args["rounds"], image_size=cfg.data.image_size,
                    torch_threads=torch.get_num_threads())
    write_report(args.get("json"), "input", settings, results)
    return results
