"""Does the node's NVIDIA driver run the CUDA this image's torch was built for?

The image comes in two flavours (docs/images.md): `-cuda13` (NGC 26.02, needs an
R580+ driver) and `-cuda12` (NGC 25.06, CUDA 12.9: R575+, or older R5xx drivers through
CUDA's compatibility paths). A driver older than the image's CUDA shows up as
"CUDA driver version is insufficient" deep inside the first job; this check says it up
front, with the tag that fits the driver.

The driver comes from /proc/driver/nvidia/version (also visible inside containers), else
from `nvidia-smi`; the image's CUDA from torch's build (torch/version.py, read as text).
Pure functions take those inputs, so the tests feed them fake ones.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

from workload.doctor.findings import FAIL, INFO, OK, WARN, Finding
from workload.commands import torch_versions

PROC_VERSION = Path("/proc/driver/nvidia/version")
# Where NGC images keep CUDA's forward-compatibility libraries (newer libcuda for older
# drivers; data-centre GPUs and supported driver branches only).
COMPAT_DIR = Path("/usr/local/cuda/compat")

# Minimum Linux driver per CUDA toolkit release (NVIDIA's CUDA Toolkit release notes,
# "CUDA Toolkit and Corresponding Driver Versions", GA releases).
MIN_DRIVER = {
    (11, 8): (520, 61, 5),
    (12, 0): (525, 60, 13),
    (12, 1): (530, 30, 2),
    (12, 2): (535, 54, 3),
    (12, 3): (545, 23, 6),
    (12, 4): (550, 54, 14),
    (12, 5): (555, 42, 2),
    (12, 6): (560, 28, 3),
    (12, 8): (570, 26, 0),
    (12, 9): (575, 51, 3),
    (13, 0): (580, 65, 6),
}

# Flavours, newest first: (tag suffix, the CUDA its base ships, the driver it needs at
# least: the major's x.0 minimum, below which not even minor-version compatibility works).
FLAVOURS = (
    ("cuda13", (13, 0), MIN_DRIVER[(13, 0)]),
    ("cuda12", (12, 9), MIN_DRIVER[(12, 0)]),
)


def parse_version(text: str) -> tuple[int, ...] | None:
    found = re.search(r"\b(\d+)\.(\d+)(?:\.(\d+))?\b", text)
    return tuple(int(g) for g in found.groups() if g is not None) if found else None


def show(version: tuple[int, ...]) -> str:
    return ".".join(f"{v:02d}" if i == 2 else str(v) for i, v in enumerate(version))


def driver_from_proc(text: str) -> tuple[int, ...] | None:
    """'NVRM version: NVIDIA UNIX x86_64 Kernel Module  565.57.01  Thu Oct 10 ...' or
    '... Open Kernel Module for aarch64  580.65.06  Release Build ...'."""
    found = re.search(r"Kernel Module(?:\s+for\s+\S+)?\s+(\d+\.\d+(?:\.\d+)?)", text)
    return parse_version(found.group(1)) if found else None


def read_driver(proc: Path = PROC_VERSION) -> tuple[tuple[int, ...] | None, str]:
    """(driver version, where it came from); (None, why not) when there is no driver."""
    try:
        version = driver_from_proc(proc.read_text())
        if version:
            return version, str(proc)
    except OSError:
        pass
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            out = subprocess.run([smi, "--query-gpu=driver_version", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=20).stdout
        except (OSError, subprocess.TimeoutExpired):
            out = ""
        version = parse_version(out.splitlines()[0]) if out.strip() else None
        if version:
            return version, "nvidia-smi"
    return None, f"no {proc} and no working nvidia-smi"


def image_cuda() -> tuple[int, int] | None:
    """The CUDA the image's torch was built for; None for a CPU-only torch."""
    cuda = torch_versions()[1] or os.environ.get("CUDA_VERSION")
    version = parse_version(cuda) if cuda else None
    return version[:2] if version else None


def required_driver(cuda: tuple[int, int]) -> tuple[int, ...]:
    """The minimum driver for a CUDA release: its own entry, else the nearest older one."""
    known = [c for c in MIN_DRIVER if c <= cuda]
    return MIN_DRIVER[max(known)] if known else MIN_DRIVER[min(MIN_DRIVER)]


def tag_for(driver: tuple[int, ...]) -> str | None:
    """The newest flavour this driver runs, or None when it runs none."""
    return next((tag for tag, _, needs in FLAVOURS if driver >= needs), None)


def flavour_of(cuda: tuple[int, int]) -> str:
    return f"cuda{cuda[0]}"


def driver_finding(driver: tuple[int, ...] | None, source: str,
                   cuda: tuple[int, int] | None, compat: bool) -> Finding:
    """The verdict for a driver (None: none found) and the image's CUDA (None: CPU torch)."""
    if cuda is None:
        return Finding("driver", INFO, "torch is a CPU-only build: no CUDA driver needed")
    image = f"this image's torch is built for CUDA {cuda[0]}.{cuda[1]} (-{flavour_of(cuda)} tag)"
    if driver is None:
        return Finding("driver", INFO, f"no NVIDIA driver found ({source}); {image}")
    needs = required_driver(cuda)
    detail = f"driver {show(driver)} (from {source}); {image}, which needs {show(needs)}+"
    if driver >= needs:
        return Finding("driver", OK, detail)
    best = tag_for(driver)
    use = (f"use the -{best} image (e.g. hpc-train:X.Y.Z-{best}; docs/images.md)"
           if best else "no published flavour runs on it: ask the site for an R525+ driver")
    if driver >= required_driver((cuda[0], 0)):
        # Same CUDA major: minor-version compatibility runs torch's kernels (not PTX JIT),
        # and NGC's forward-compatibility libraries cover the rest on data-centre GPUs.
        return Finding("driver", INFO, detail + ": runs by CUDA minor-version compatibility "
                       "(kernels JIT-compiled from PTX need the newer driver)")
    if compat:
        return Finding("driver", WARN, detail + f": only CUDA's forward compatibility "
                       f"({COMPAT_DIR}) can bridge the gap, on data-centre GPUs with a "
                       "supported driver branch", f"if CUDA fails to start, {use}")
    return Finding("driver", FAIL, detail + ": too old for this image, and no forward "
                   "compatibility libraries in it", use)


def driver_check() -> Finding:
    """The hook doctor runs: the real driver, the real image."""
    driver, source = read_driver()
    return driver_finding(driver, source, image_cuda(), COMPAT_DIR.is_dir())
