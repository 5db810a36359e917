"""What both benchmarks share: the config from the flags, timing, the table, the JSON."""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import torch

from workload.bench.fingerprint import fingerprint
from workload.bench.flags import BENCH_FIXED
from workload.config import TrainConfig, build_config
from workload.distributed import resolve_device
from workload.files import write_json
from workload.training.trainer import sync


def config_from(args: dict, **overrides) -> TrainConfig:
    """A validated TrainConfig from bench's flags (None = not given), like `train` builds it."""
    given = {**args, **BENCH_FIXED, **overrides}
    device = resolve_device(given.get("device") or TrainConfig().hardware.device)
    return build_config(given, device.type)


def timed(device: torch.device, work) -> float:
    """Seconds `work()` takes, the device synchronised before and after."""
    sync(device)
    start = time.perf_counter()
    work()
    sync(device)
    return time.perf_counter() - start


def summarise(rates: list[float]) -> dict:
    return {"images_per_second": statistics.median(rates), "runs_images_per_second": rates}


def print_table(header: list[str], rows: list[list]) -> None:
    cells = [header] + [[_cell(v) for v in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    for n, row in enumerate(cells):
        print("  ".join(c.rjust(w) if n and i else c.ljust(w)
                        for i, (c, w) in enumerate(zip(row, widths))))
        if n == 0:
            print("  ".join("-" * w for w in widths))


def _cell(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.1f}" if abs(value) >= 10 else f"{value:.3g}"
    return str(value)


def write_report(path: str | None, command: str, settings: dict, results: dict) -> None:
    """The JSON: each backend or configuration under its name in `results`, plus the
    fingerprint of the machine and software that produced the figures."""
    if not path:
        return
    out = Path(path).expanduser()
    out.parent.mkdir(parents=True, exist_ok=True)
    write_json(out, {"command": command, "settings": settings, "results": results,
                     "fingerprint": fingerprint()})
    print(f"bench: results in {out}")
