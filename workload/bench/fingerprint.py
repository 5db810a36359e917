"""What a benchmark figure depends on, written next to every figure: devices, driver,
library versions, precision switches, threads, host and SLURM job."""

from __future__ import annotations

import os
import platform
import socket
import time
from pathlib import Path

import torch

from workload.records import versions


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
