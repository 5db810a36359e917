"""What both benchmarks share: the config from the flags, timing, the table, and the JSON
with the fingerprint of what a figure depends on (devices, driver, library versions,
precision switches, threads, host and SLURM job), written next to every figure."""

from __future__ import annotations

import os
import platform
import socket
import statistics
import time
from contextlib import contextmanager
from pathlib import Path
from collections.abc import Iterator

import torch

from workload.bench.flags import BENCH_FIXED
from workload.commands import start_up_over
from workload.config import TrainConfig, build_config
from workload.distributed import DistInfo, resolve_device
from workload.files import write_json
from workload.launch import PreemptionFlag
from workload.records import versions
from workload.training.build import start_process
from workload.training.probe import sync


def config_from(args: dict, **overrides) -> TrainConfig:
    """A validated TrainConfig from bench's flags (None = not given), like `train` builds it."""
    given = {**args, **BENCH_FIXED, **overrides}
    device = resolve_device(given.get("device") or TrainConfig().hardware.device)
    return build_config(given, device.type)


@contextmanager
def bench_process(args: dict, cfg: TrainConfig,
                  flag: PreemptionFlag | None) -> Iterator[DistInfo]:
    """The process started as `train` starts it (launch, device, process group with
    --dist-timeout, left at the end; `flag`: bench's, None in make gpu-check, which answers
    no signals), then bench's --threads."""
    with start_process(cfg, flag) as (info, _):
        # On a shared, busy CPU, fewer threads than cores can be much faster: parallel
        # regions wait for their slowest thread. One setting for every run keeps the
        # comparison fair; set after the start, which sets the launch's own count.
        if args.get("threads"):
            torch.set_num_threads(args["threads"])
        yield info


def timed(device: torch.device, work) -> float:
    """Seconds `work()` takes, the device synchronised before and after; with the cyclic
    collector on, as train's loop runs."""
    start_up_over()
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


# ---------------------------------------------------------------- the fingerprint
def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def nvidia_driver() -> str | None:
    # The kernel module's version file; no nvidia-smi call, which can hang on a sick node.
    try:
        return Path("/proc/driver/nvidia/version").read_text().splitlines()[0].strip()
    except (OSError, IndexError):
        return None


def device_names() -> list[str]:
    if torch.cuda.is_available():
        return [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return [f"cpu: {cpu_model()}"]


def nccl_version() -> str | None:
    if not torch.cuda.is_available():
        return None
    return ".".join(str(part) for part in torch.cuda.nccl.version())


def switches() -> dict:
    return {
        "tf32_matmul": torch.backends.cuda.matmul.allow_tf32,
        "tf32_cudnn": torch.backends.cudnn.allow_tf32,
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "cudnn_benchmark": torch.backends.cudnn.benchmark,
    }


def threads() -> dict:
    return {
        "torch_threads": torch.get_num_threads(),
        "torch_interop_threads": torch.get_num_interop_threads(),
        "cpus_usable": len(os.sched_getaffinity(0)),
        "cpus_total": os.cpu_count(),
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
        "SLURM_CPUS_PER_TASK": os.environ.get("SLURM_CPUS_PER_TASK"),
    }


def fingerprint() -> dict:
    return {
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "host": socket.gethostname(),
        "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
        "devices": device_names(),
        "driver": nvidia_driver(),
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.cuda.is_available() else None,
        "nccl": nccl_version(),
        "versions": versions(),
        "python": platform.python_version(),
        "switches": switches(),
        "threads": threads(),
    }
