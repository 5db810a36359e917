"""Energy of a training run (docs/energy.md): every rank's GPU board through NVML's
total-energy counter, and each node's CPU packages through RAPL, counted apart.

Each rank reads its own GPU's counter (`nvmlDeviceGetTotalEnergyConsumption`,
millijoules since the driver loaded) on a thread of its own (the call takes milliseconds:
workload.training.background_read): the log interval's exchange takes the latest reading,
a checkpoint and the end a fresh one; local rank 0 of each node reads the node's RAPL
package counters (`/sys/class/powercap/intel-rapl:N/energy_uj`, wrapping at
`max_energy_range_uj`). Nothing is read inside a step. The ranks' sums travel in the
log interval's one exchange, as one of its contributors (workload.training.interval), in
the checkpoint's collective and in one gather at the end.

The running total is a stateful part of the checkpoint (`gather_across_ranks`, the
collective, then `state_dict`/`load_state_dict`, saved as `energy` in the trainer state,
JSON), so a preempted and resumed run reports the
energy of all its jobs. A counter that is missing
is "unavailable: <why>" with null values, never 0. A counter that goes backwards (a
driver reload) is counted again from its new value, and one that stops answering ends
the count; either is said once, and neither stops the training.
"""

from __future__ import annotations

import math
import os
import time
from pathlib import Path

from workload import distributed
from workload.files import open_regular
from workload.training.background_read import BackgroundReader
from workload.logs import logger

GPU_SOURCE = "nvml-total-energy"
CPU_SOURCE = "rapl-package-whole-node"
POWERCAP = Path("/sys/class/powercap")
# A CPU rank reads NVML GPU LOCAL_RANK only where this is "1" AND the pynvml module says it
# is a stand-in (tests/scripts/nvml_stand_in): a CPU run never reports a real GPU's energy.
STAND_IN_VARIABLE = "HPC_TRAIN_NVML_STAND_IN"
NOT_COUNTED = ("counted from each job's start of training to its last checkpoint, or to "
               "its end; a preemption signal saves at the stop, but a job killed without "
               "one (kill -9, a node failure) loses what it spent after its last checkpoint")
JOULES_PER_KWH = 3.6e6
EARLIER = "not counted in an earlier job of this run"


class Meter:
    """One cumulative counter read as joules: the energy since this job's first reading,
    or the reason it is not counted (then `total_j` is None). `at` is when the reading
    behind the total was taken (time.perf_counter)."""

    def __init__(self, name: str, read=None, reason: str | None = None):
        self.name = name
        self.read = read
        self.reason = reason
        self.total_j = 0.0
        self.last = None
        self.went_back = False
        self.at = time.perf_counter()
        if read is not None:
            try:
                self.last, self.at = self._timed(fresh=True)
            except Exception as error:  # noqa: BLE001 - NOT_SUPPORTED before Volta, ...
                self.reason = f"{name} cannot be read ({error})"

    @property
    def counting(self) -> bool:
        return self.reason is None

    def _timed(self, fresh: bool) -> tuple[float, float]:
        """The counter's value and when it was read: `fresh=False` takes a background
        reader's newest reading (workload.training.background_read)."""
        timed = getattr(self.read, "fresh" if fresh else "latest", None)
        if timed is None:  # a plain, quick counter: read now
            return float(self.read()), time.perf_counter()
        value, at = timed()
        return float(value), at

    def _reading(self, fresh: bool) -> tuple[float, float] | None:
        try:
            return self._timed(fresh)
        except Exception as error:  # noqa: BLE001 - any failure of a counter: never fatal
            self.reason = f"{self.name} stopped answering ({error})"
            logger.warning(f"energy: {self.reason}; its energy is not counted from here on")
            return None

    def update(self, fresh: bool = True) -> float | None:
        """Read the counter into the total; the total so far, None if not counting."""
        if not self.counting:
            return None
        reading = self._reading(fresh)
        if reading is None:
            return None
        now, self.at = reading
        delta = now - self.last
        if delta < 0:  # a driver reload restarts the counter: it counts from there
            delta = now
            if not self.went_back:
                self.went_back = True
                logger.warning(f"energy: {self.name} went backwards ({self.last:.0f} J, "
                               f"then {now:.0f} J: the driver reloaded?); counting on from "
                               "its new value, the energy between the two readings is lost")
        self.last = now
        self.total_j = self.total_j + delta
        return self.total_j

    def total(self) -> float:
        """The total as a number for a collective: NaN when not counting."""
        return self.total_j if self.counting else math.nan


def gpu_meter(device, local_rank: int) -> Meter:
    """This rank's GPU board energy counter, or the reason there is none."""
    name = "the GPU's energy counter"
    try:
        import pynvml
    except ImportError:
        return Meter(name, reason="nvidia-ml-py (pynvml) is not installed")
    stand_in = (getattr(pynvml, "STAND_IN", False)
                and os.environ.get(STAND_IN_VARIABLE) == "1")
    if getattr(device, "type", "cpu") != "cuda" and not stand_in:
        return Meter(name, reason="the ranks run on the CPU")
    try:
        pynvml.nvmlInit()
        handle = (pynvml.nvmlDeviceGetHandleByIndex(local_rank) if stand_in
                  else gpu_handle(pynvml, device))
    except pynvml.NVMLError as error:  # no driver, no such GPU
        return Meter(name, reason=f"NVML did not start or find the GPU ({error})")
    read = pynvml.nvmlDeviceGetTotalEnergyConsumption
    return Meter(name, BackgroundReader(lambda: read(handle) / 1000, "energy-counter"))


def gpu_handle(pynvml, device):
    """NVML numbers GPUs regardless of CUDA_VISIBLE_DEVICES: find ours by PCI address."""
    import torch
    props = torch.cuda.get_device_properties(device)
    address = f"{props.pci_domain_id:08X}:{props.pci_bus_id:02X}:{props.pci_device_id:02X}.0"
    return pynvml.nvmlDeviceGetHandleByPciBusId(address)


class Rapl:
    """The node's CPU package counters (one per socket), as one cumulative joule count
    that carries each counter over its wrap (max_energy_range_uj)."""

    def __init__(self, zones: list[Path]):
        self.zones = zones
        self.ranges = [counter(z / "max_energy_range_uj") for z in zones]
        if 0 in self.ranges:
            zone = self.zones[self.ranges.index(0)]
            raise ValueError(f"{zone / 'max_energy_range_uj'} holds 0, not a counter's range")
        self.raw = [self._raw(z) for z in zones]
        self.joules = 0.0

    @staticmethod
    def _raw(zone: Path) -> int:
        return counter(zone / "energy_uj")

    def __call__(self) -> float:
        for i, zone in enumerate(self.zones):
            now = self._raw(zone)
            self.joules += ((now - self.raw[i]) % self.ranges[i]) / 1e6
            self.raw[i] = now
        return self.joules


# The most bytes a counter file holds: a microjoule count in decimal, with room to spare.
COUNTER_BYTES = 64


def counter(path: Path) -> int:
    """A RAPL counter file's value, a whole number of microjoules; ValueError naming the
    file and what it holds otherwise, OSError when it is no regular file (read once,
    COUNTER_BYTES at most: a stand-in tree may hold anything)."""
    with open(open_regular(path), "rb") as file:
        text = file.read(COUNTER_BYTES + 1)
    if len(text) > COUNTER_BYTES:
        raise ValueError(f"{path} holds more than {COUNTER_BYTES} bytes, not a counter")
    if not text.strip().isdigit():
        raise ValueError(f"{path} holds {text.decode(errors='replace')!r}, not a whole "
                         "number of microjoules")
    return int(text)


def package_zones(root: Path = POWERCAP) -> list[Path]:
    """The top-level RAPL zones named package-N (not their core/dram sub-zones, and not
    psys, which covers the packages again)."""
    found = []
    for zone in sorted(root.glob("intel-rapl:*")):
        name = zone / "name"
        if (zone.name.count(":") == 1 and name.is_file()
                and name.read_text().strip().startswith("package")):
            found.append(zone)
    return found


def cpu_meter(local_rank: int, root: Path = POWERCAP) -> Meter:
    """The node's CPU package energy, read by its local rank 0 (the others count 0: the
    node is counted once)."""
    name = "the node's CPU package energy (RAPL)"
    if local_rank != 0:
        return Meter(name, read=lambda: 0.0)
    zones = package_zones(root)
    if not zones:
        return Meter(name, reason=f"no RAPL package zones under {root}")
    try:
        return Meter(name, Rapl(zones))
    except OSError as error:  # energy_uj is root's alone on many kernels: no news
        return Meter(name, reason=f"RAPL cannot be read ({error.strerror or error})")
    except ValueError as error:  # a counter that is no number: worth a line
        logger.warning(f"energy: {name} is not counted: {error}")
        return Meter(name, reason=f"RAPL cannot be read ({error})")


def ranks_sum(values: list[float]) -> float | None:
    """The sum over ranks, None when a rank has no figure (a part is no total)."""
    return None if any(math.isnan(v) for v in values) else float(sum(values))


def ratio(joules: float | None, count: int | float) -> float | None:
    return None if joules is None or not count else joules / count


class EnergyAccount:
    """This rank's energy in this job and the run's earlier jobs (from the checkpoint it
    resumed from): a stateful part of the checkpoint (TrainState.parts) and a contributor
    to the log interval's exchange (workload.training.interval). The run's totals are
    collectives: every rank calls `gather_across_ranks`, then `state_dict` reads it."""

    def __init__(self, gpu: Meter, cpu: Meter, device, world_size: int, probe=None):
        self.gpu = gpu
        self.cpu = cpu
        self.device = device
        self.world_size = world_size
        self.earlier = dict(gpu_j=0.0, gpu_source=GPU_SOURCE, cpu_package_j=0.0,
                            cpu_package_source=CPU_SOURCE, images=0, jobs=0)
        self.probe = probe  # the loop's (workload.training.probe): the images trained
        self.gathered: dict | None = None  # the last gather_across_ranks
        self.mark = [(0.0, gpu.at), (0.0, cpu.at)]  # each total and its reading's time

    @classmethod
    def for_rank(cls, info, probe) -> EnergyAccount:
        """First readings now: this job's energy counts from here; `probe` counts the
        images its per-image energy divides by."""
        return cls(gpu_meter(info.device, info.local_rank), cpu_meter(info.local_rank),
                   info.device, info.world_size, probe)

    # --- a contributor to the log interval's exchange (workload.training.interval) ---
    def start(self) -> None:
        """A fresh reading: the intervals start with the training."""
        self.numbers(fresh=True)

    def numbers(self, steps: int = 0, fresh: bool = False) -> list[float]:
        """This rank's numbers for the log interval's exchange: GPU joules and watts
        between the last two readings (their own times), then the CPU's, then both totals
        of this job (NaN: not counting, or no newer reading yet). The GPU's reading is the
        one the previous call started (background_read): its figures are the interval
        before. (Energy is per interval, not per step: `steps` is not needed.)"""
        now = [(meter.update(fresh), meter.at) for meter in (self.gpu, self.cpu)]
        numbers: list[float] = []
        for index, ((total, at), (total0, at0)) in enumerate(zip(now, self.mark)):
            if total is None or at <= at0:
                numbers += [math.nan, math.nan]
                continue
            numbers += [total - total0, (total - total0) / (at - at0)]
            self.mark[index] = (total, at)
        return [*numbers, self.gpu.total(), self.cpu.total()]

    def read(self, rows: list[list[float]], step: int = 0) -> dict:
        """The fields a steps.jsonl line adds: the interval's energy and mean power summed
        over the ranks, and the run's totals so far; null where a rank has no counter."""
        column = [ranks_sum([row[i] for row in rows]) for i in range(6)]
        return dict(gpu_energy_j=column[0], gpu_power_w=column[1],
                    gpu_energy_total_j=self._plus("gpu_j", column[4]),
                    cpu_package_energy_j=column[2], cpu_package_power_w=column[3],
                    cpu_package_energy_total_j=self._plus("cpu_package_j", column[5]))

    def _plus(self, key: str, this_job: float | None) -> float | None:
        earlier = self.earlier[key]
        return None if earlier is None or this_job is None else earlier + this_job

    def gather_across_ranks(self) -> dict:
        """The run's energy so far, all ranks and jobs: what a checkpoint holds and the
        summary reports. A collective: every rank calls it, before state_dict."""
        self.gpu.update()
        self.cpu.update()
        rows = distributed.all_gather_floats(
            [self.gpu.total(), self.cpu.total(),
             float(self.probe.images if self.probe else 0)], self.device)
        gpu = ranks_sum([r[0] for r in rows])
        cpu = ranks_sum([r[1] for r in rows])
        reasons = ([] if gpu is not None and cpu is not None else distributed.gather_objects(
            {"gpu": self.gpu.reason, "cpu": self.cpu.reason}, self.world_size))
        e = self.earlier
        self.gathered = dict(gpu_j=self._plus("gpu_j", gpu),
                    gpu_source=self._source("gpu", e["gpu_source"], reasons),
                    cpu_package_j=self._plus("cpu_package_j", cpu),
                    cpu_package_source=self._source("cpu", e["cpu_package_source"], reasons),
                    images=e["images"] + int(sum(r[2] for r in rows)), jobs=e["jobs"] + 1)
        return self.state_dict()

    def state_dict(self) -> dict:
        """What the last gather_across_ranks found (no collective: this rank alone)."""
        if self.gathered is None:
            raise RuntimeError("the energy account's state_dict before its "
                               "gather_across_ranks: every rank gathers first")
        return dict(self.gathered)

    @staticmethod
    def _source(part: str, earlier: str, reasons: list[dict]) -> str:
        ranks_by_why: dict[str, list[int]] = {}
        for rank, r in enumerate(reasons):
            if r[part]:
                ranks_by_why.setdefault(r[part], []).append(rank)
        if list(ranks_by_why.values()) == [list(range(len(reasons)))]:
            return f"unavailable: {next(iter(ranks_by_why))}"  # every rank, one reason
        if ranks_by_why:
            return "unavailable: " + "; ".join(
                f"rank {ranks[0]}{f' and {len(ranks) - 1} more' if len(ranks) > 1 else ''}: "
                f"{why}" for why, ranks in ranks_by_why.items())
        if earlier.startswith("unavailable") and EARLIER not in earlier:
            return f"unavailable: {EARLIER} ({earlier.removeprefix('unavailable: ')})"
        return earlier

    def load_state_dict(self, saved) -> None:
        """The checkpoint's record of the earlier jobs; one that has none (written before
        energy was counted) or an unreadable one leaves the total unavailable."""
        if not valid_record(saved):
            why = "the checkpoint resumed from holds no readable energy record"
            logger.warning(f"energy: {why}; this run's total energy is not known")
            why = f"unavailable: {why}"
            self.earlier = dict(gpu_j=None, gpu_source=why, cpu_package_j=None,
                                cpu_package_source=why, images=0, jobs=0)
            return
        self.earlier = dict(saved)


RECORD_TYPES = dict(gpu_j=(float, int, type(None)), gpu_source=str,
                    cpu_package_j=(float, int, type(None)), cpu_package_source=str,
                    images=int, jobs=int)


def valid_record(saved) -> bool:
    return (isinstance(saved, dict) and set(saved) == set(RECORD_TYPES) and all(
        isinstance(saved[k], kind) and not isinstance(saved[k], bool)
        for k, kind in RECORD_TYPES.items()))


def summary_fields(record: dict, steps: int) -> dict:
    """summary.json's energy: totals, kWh, per image and per step, and their sources."""
    gpu = record["gpu_j"]
    cpu = record["cpu_package_j"]
    return dict(gpu_energy_source=record["gpu_source"], gpu_energy_j=gpu,
                gpu_energy_kwh=ratio(gpu, JOULES_PER_KWH),
                gpu_energy_per_image_j=ratio(gpu, record["images"]),
                gpu_energy_per_step_j=ratio(gpu, steps),
                cpu_package_energy_source=record["cpu_package_source"],
                cpu_package_energy_j=cpu, cpu_package_energy_kwh=ratio(cpu, JOULES_PER_KWH),
                energy_jobs=record["jobs"], energy_not_counted=NOT_COUNTED)
