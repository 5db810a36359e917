"""A stand-in for nvidia-ml-py's `pynvml` with a scripted energy counter, for `train` runs
on CPU ranks (tests/e2e/test_energy.py). This folder goes first on PYTHONPATH, and
HPC_TRAIN_NVML_STAND_IN=1 lets a CPU rank read "GPU" LOCAL_RANK here: train reads a CPU
rank's NVML only when both say so (workload.training.energy).

NVML_STAND_IN_SCRIPT names a JSON file: per GPU index (a string), a `mode` and `mj`,
the millijoules the counter moves per reading, and `after`, the reading where the mode
acts:
  steady         START + n * mj at the n-th reading (from 0)
  backwards      the same, but from reading `after` on, it restarts: (n - after + 1) * mj
  fails          steady, then every reading from `after` on raises GPU_IS_LOST
  not_supported  every reading raises NOT_SUPPORTED (a GPU older than Volta)
Each value returned is appended to NVML_STAND_IN_LOG/<pid>-<index>.txt, one per line, so
a test knows what every process was told.
"""

import json
import os
from pathlib import Path

STAND_IN = True
START = 5_000_000_000  # millijoules since the (pretend) driver loaded
NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_GPU_IS_LOST = 3, 15
_NAMES = {NVML_ERROR_NOT_SUPPORTED: "Not Supported", NVML_ERROR_GPU_IS_LOST: "GPU is lost"}
_readings: dict[int, int] = {}


class NVMLError(Exception):
    def __init__(self, value: int):
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return _NAMES.get(self.value, f"NVML error {self.value}")


def nvmlInit() -> None:
    pass


def nvmlShutdown() -> None:
    pass


def nvmlDeviceGetHandleByIndex(index: int) -> int:
    return index


def _script(index: int) -> dict:
    return json.loads(Path(os.environ["NVML_STAND_IN_SCRIPT"]).read_text())[str(index)]


def nvmlDeviceGetTotalEnergyConsumption(handle: int) -> int:
    script = _script(handle)
    mode, mj, after = script["mode"], script.get("mj", 1000), script.get("after", 0)
    n = _readings.get(handle, 0)
    _readings[handle] = n + 1
    if mode == "not_supported":
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    if mode == "fails" and n >= after:
        raise NVMLError(NVML_ERROR_GPU_IS_LOST)
    value = (n - after + 1) * mj if mode == "backwards" and n >= after else START + n * mj
    log = Path(os.environ["NVML_STAND_IN_LOG"]) / f"{os.getpid()}-{handle}.txt"
    with open(log, "a") as stream:
        stream.write(f"{value}\n")
    return value
