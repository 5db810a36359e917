"""The kit's first step, taken apart: `train` started as a job starts it (`python -m
workload.train`, a new process each), its start-up phases read from its summary.json
(workload/training/startup.py: imports, process group, data, model, resume, cudnn
autotune, compile, first step), for a cold start (an empty cache folder: another node), a
warm one (the same folder again), and, warm, cuDNN's benchmark mode (off by default) with
torch's 10 algorithms tried per convolution, with one (--cudnn-benchmark-limit 1) and with
every one (0). Each start also reports the run's steady images/s (after its first step),
so a shorter start is weighed against a faster step. On a GPU each start also says when
CUDA's context, started in a thread of its own while `train` imports, began and was ready
(`cuda_context_s`, seconds since the process started; workload/training/startup.py).

On a CPU, benchmark mode is off and cuDNN absent: the cold and warm starts run (their
phases are the CPU's; `cudnn autotune` is a moment), and the cuDNN variants are rows that
say they do not apply.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from workload.caches import CACHE_KEYS
from workload.launch.diagnostics import STARTUP_ORDER
from workload.runfolder import RunFolder

# name -> (extra flags, warm: the cache folder of the cold start)
STARTS = {"cold": ([], False), "warm": ([], True),
          "benchmark": (["--cudnn-benchmark"], True),
          "benchmark-limit-1": (["--cudnn-benchmark", "--cudnn-benchmark-limit", "1"], True),
          "benchmark-limit-0": (["--cudnn-benchmark", "--cudnn-benchmark-limit", "0"], True)}
CUDNN_ONLY = "cuDNN's settings: does not apply on the CPU (no cuDNN, benchmark mode off)"
# The reference recipe's model at batch 256 on CIFAR-100-shaped data in memory; 20 steps
# (the steady images/s from 19). Quick: the kit's tiny sizes.
FULL_ARGS = ["--model", "wrn", "--dataset", "synthetic", "--synthetic-size", "5120",
             "--num-classes", "100", "--batch-size", "256", "--max-steps", "20"]
QUICK_ARGS = ["--model", "wrn", "--width", "8", "--blocks-per-stage", "1", "--dataset",
              "synthetic", "--synthetic-size", "32", "--image-size", "16", "--num-classes",
              "4", "--batch-size", "8", "--max-steps", "3"]
START_LIMIT_S = 240


def measure(device, quick: bool, save) -> dict:
    """Every start in STARTS order; `save(part)` after each."""
    part = dict(command=train_command(device, quick, Path("RUN")), starts=[])
    with tempfile.TemporaryDirectory(prefix="kit-first-step-") as top:
        caches = Path(top) / "caches"
        for name, (flags, warm) in STARTS.items():
            if flags and device.type != "cuda":
                part["starts"].append(dict(name=name, status="not run", reason=CUDNN_ONLY))
                continue
            if not warm:
                caches.mkdir()
            part["starts"].append(started(name, device, quick, flags, Path(top), caches))
            save(part)
    return part


def train_command(device, quick: bool, out: Path, flags=()) -> list[str]:
    return [sys.executable, "-m", "workload.train", *(QUICK_ARGS if quick else FULL_ARGS),
            "--device", device.type, "--epochs", "1", "--resume", "never", *flags,
            "--output-dir", str(out)]


def started(name: str, device, quick: bool, flags: list[str], top: Path, caches: Path) -> dict:
    """One start of train in a new process: its phases, or why there are none."""
    out = top / name
    # The node-local cache folder (caches.py) under TMPDIR: no cache variable of ours.
    env = {k: v for k, v in os.environ.items() if k not in (*CACHE_KEYS, "SLURM_TMPDIR")}
    env["TMPDIR"] = str(caches)
    began = time.monotonic()
    try:
        done = subprocess.run(train_command(device, quick, out, flags), env=env,
                              capture_output=True, text=True, timeout=START_LIMIT_S)
    except subprocess.TimeoutExpired:
        return dict(name=name, flags=flags, status="failed",
                    reason=f"train did not end within {START_LIMIT_S} s")
    record = dict(name=name, flags=flags, wall_s=time.monotonic() - began)
    try:
        summary = json.loads(RunFolder(out).summary.read_text())
    except (OSError, ValueError):
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        return dict(record, status="failed",
                    reason=f"train exited {done.returncode}: {' / '.join(tail)}"[:500])
    startup = summary.get("startup") or {}
    phases = startup.get("phases_s") or {}
    in_order = {name: phases[name] for name in STARTUP_ORDER if name in phases}
    return dict(record, status="measured", reason=None, phases_s=in_order,
                to_first_step_s=startup.get("to_first_step_s"),
                cuda_context_s=startup.get("cuda_context_s"),
                images_per_second=summary.get("images_per_second"))
