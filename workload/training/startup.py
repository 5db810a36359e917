"""Start-up phases: where each rank's time to its first step goes.

The clock starts where the process started (read from /proc: the interpreter's start, not
the first line of ours), or where the job started when SLURM says
(`SLURM_JOB_START_TIME`): the time before this process (srun, the container's start, the
batch script's earlier steps) is then the first phase. `run` marks the end of each later
phase: imports (the interpreter, torch and ours), the process group, the data (download
check, staging, the datasets), the model (built, wrapped, its optimizer), the resume,
cuDNN's autotuning (`cudnn autotune`: with --cudnn-benchmark on CUDA, one forward and backward
at the run's batch shape before the first step, so the time cuDNN spends choosing its
algorithms is its own phase; a moment where nothing is tuned: the CPU, benchmark mode
off, FSDP), and the first step (the loader's workers, the first collectives), with
the compilers' share of it split out as `compile` (torch.compile's own timers). Each rank
writes its marks as they happen to `diagnostics/startup-rank-N.json` once the run folder
exists (a requeued job's from the start), so a job that never reached its first step still
says which phase it was in. After the first step the ranks exchange their phases in one
small all-gather; rank 0 logs them with the slowest rank of each, keeps them in
summary.json (`startup`), and names a phase that took far longer than in the run's
previous job.
"""

from __future__ import annotations

import os
import re
import sys
import threading
import time
from pathlib import Path

from workload.config import out_of_range
from workload.files import proc_stat_fields, write_json
from workload.held import let_go
from workload.launch.diagnostics import (STARTUP_ORDER, STARTUP_PREFIX, error_text,
                                         hold_diagnostics)
from workload.launch.variables import node_name
from workload.logs import logger

BEFORE = STARTUP_ORDER[0]
COMPILE = STARTUP_ORDER[-2]
FIRST_STEP = STARTUP_ORDER[-1]
# torch.compile's own timers (torch._dynamo.utils.compilation_time_metrics): a frame's
# compilation (forward and the joint graph), and the backward's, compiled lazily at the
# first backward. Measured: their sum was 162 of a 165 s first compiled step on the CPU.
COMPILE_TIMERS = ("_compile.compile_inner", "compile_fx.<locals>.bw_compiler")
# A phase is named when it took this many times its previous job's and this much longer.
SLOWER_FACTOR = 3.0
SLOWER_BY_S = 10.0


def process_start() -> float | None:
    """When this process started (epoch seconds, to the kernel's clock tick), or None
    where /proc does not say. Read once a process (a forked child reads its own): the
    epoch and the boot clock are two clocks read one after the other, so each reading
    moved by the moments between them (by up to 10 ms with /proc/uptime's hundredths, and
    more under load), and a phase measured against one reading and a whole second taken
    from another crossed that second (8.0000026 s where at most 8 can be)."""
    pid = os.getpid()
    if pid not in _STARTED:
        _STARTED[pid] = _read_process_start()
    return _STARTED[pid]


_STARTED: dict[int, float | None] = {}


def _read_process_start() -> float | None:
    try:
        fields = proc_stat_fields()
        if fields is None:
            return None
        started_ticks = int(fields[19])  # field 22 of stat(5)
    except (OSError, ValueError, IndexError):
        return None
    # stat(5)'s start time counts on the boot clock (CLOCK_BOOTTIME, in clock ticks).
    age = time.clock_gettime(time.CLOCK_BOOTTIME) - started_ticks / os.sysconf("SC_CLK_TCK")
    return time.time() - age


# When the CUDA context's thread began and had the context (epoch seconds), once started.
CUDA_CONTEXT: dict[str, float] = {}


def start_cuda_context(device_flag: str) -> threading.Thread | None:
    """Start CUDA's context on this rank's GPU in a thread of its own, while the main
    thread imports the rest of `train`: on the H200 the imports (4.2 s) and the model with
    the context (4.2 s) came one after the other before the first step. Only where a GPU
    is the device (--device cpu, or no GPU under auto: nothing). The launch's own GPU
    choice (workload.launch.resolve) picks the device; a failure here is left for the
    main thread's first use of CUDA to report, with its message."""
    import torch  # the caller has it (the device was resolved with it)

    if device_flag == "cpu" or not torch.cuda.is_available():
        return None
    thread = threading.Thread(target=_cuda_context, name="cuda-context", daemon=True)
    thread.start()
    return thread


def _cuda_context() -> None:
    import torch

    from workload.launch import resolve

    CUDA_CONTEXT["started"] = time.time()
    try:
        index = resolve(os.environ, visible_gpus=torch.cuda.device_count()).gpu_index or 0
        torch.empty(1, device=torch.device("cuda", index))  # the primary context
    except Exception:  # noqa: BLE001 -- the main thread's use of CUDA says what failed
        return
    CUDA_CONTEXT["ready"] = time.time()


def cuda_context_times(origin: float) -> dict[str, float] | None:
    """Seconds from `origin` (the process's start) to the CUDA context's thread starting
    and having the context, where it ran: the phases split the context from the model."""
    if "ready" not in CUDA_CONTEXT:
        return None
    return {key: at - origin for key, at in CUDA_CONTEXT.items()}


def job_start(env=os.environ) -> float | None:
    value = env.get("SLURM_JOB_START_TIME", "")
    return float(value) if re.fullmatch(r"[0-9]{1,12}", value) else None


def compile_seconds() -> float:
    """What torch.compile spent in this process so far (0 when it never ran)."""
    utils = sys.modules.get("torch._dynamo.utils")  # imported only once something compiled
    metrics = getattr(utils, "compilation_time_metrics", None) or {}
    return float(sum(sum(metrics.get(timer, ())) for timer in COMPILE_TIMERS))


def tune_convolutions(model, cfg, device, precision: str) -> None:
    """The cuDNN autotuning phase (precision.autotune_convolutions) on this rank's model
    at the run's batch shape; nothing where benchmark mode is off (the default, and
    always on the CPU) or under FSDP (whose sharded forward is not run outside a
    step), so the phase is then the moment between two marks."""
    from workload import distributed  # here: the clock itself is read before torch is
    from workload.config import image_size_of
    from workload.precision import autotune_convolutions

    if cfg.distributed.strategy == "fsdp":
        return
    side = image_size_of(cfg)
    autotune_convolutions(distributed.unwrap(model), (cfg.training.batch_size, 3, side, side),
                          cfg.hardware.channels_last, precision, device)


def record_name(env=os.environ) -> str:
    """This process's record, named by its rank before the process group forms
    (torchrun's or srun's)."""
    rank = next((env[key] for key in ("RANK", "SLURM_PROCID")
                 if re.fullmatch(r"[0-9]{1,7}", env.get(key, ""))), "0")
    return f"{STARTUP_PREFIX}{int(rank)}.json"


class StartupClock:
    """The marks of one rank; `record` writes them where diagnose reads them."""

    def __init__(self, record: Path | None = None, env=os.environ):
        self.origin = process_start() or time.time()
        self.job = job_start(env)
        self.record = record
        self.marks: list[tuple[str, float]] = []
        self.compile_s = 0.0
        self.error = ""

    def write_in(self, folder: Path) -> None:
        """The marks from now on into `folder` (the run folder's diagnostics/ reached
        through the held run folder, once train holds it), under the record's name."""
        if self.record is not None:
            self.record = folder / self.record.name

    def mark(self, phase: str) -> None:
        self.marks.append((phase, time.time()))
        if phase == FIRST_STEP:
            self.compile_s = compile_seconds()
        self.write()

    def failed(self, error: BaseException) -> None:
        """The start-up ended in `error` (before the first step: after it, the stall
        watchdog's last heartbeat says how the rank failed): the record keeps it, with
        this node, for diagnose's decision (a GPU that fails as it is first used)."""
        if not any(phase == FIRST_STEP for phase, _ in self.marks):
            self.error = error_text(error)
            self.write()

    def write(self) -> None:
        # Only into a run folder that exists (a requeued job's, or one made for the job):
        # train creates it once the inputs are checked, and bad input writes nothing.
        if self.record is not None and self.record.parent.parent.is_dir():
            try:
                held = hold_diagnostics(self.record.parent)  # never through a planted link
                try:
                    write_json(held / self.record.name, self.describe())
                finally:
                    let_go(held)
            except OSError:  # diagnostics never stop a start (watching() says why)
                self.record = None

    def phases(self) -> dict[str, float]:
        """Seconds per phase, in order, from the process's (or the job's) start."""
        # max: the job's start is slurmctld's clock, the process's this node's
        found = {BEFORE: max(0.0, self.origin - self.job)} if self.job is not None else {}
        last = self.origin
        for phase, at in self.marks:
            found[phase] = at - last
            last = at
        if self.compile_s and FIRST_STEP in found:  # split out of the first step
            step = found.pop(FIRST_STEP)
            found[COMPILE] = min(self.compile_s, step)
            found[FIRST_STEP] = step - found[COMPILE]
        return found

    def describe(self) -> dict:
        return {"since": "job start" if self.job is not None else "process start",
                "phases_s": self.phases(),
                "last_phase": self.marks[-1][0] if self.marks else None,
                "at": self.marks[-1][1] if self.marks else self.origin,
                **({"error": self.error, "host": node_name()} if self.error else {})}


def across_ranks(clock: StartupClock, device) -> dict:
    """Every rank's phases (one all-gather of a few numbers, every rank calls it): the
    summary's `startup`, with the slowest rank of each phase."""
    from workload import distributed  # here: the clock itself is read before torch is

    mine = clock.phases()
    names = [name for name in STARTUP_ORDER if name in mine]
    every = distributed.all_gather_floats([mine.get(name, 0.0) for name in names], device)
    slowest = {name: max(range(len(every)), key=lambda rank: every[rank][i])
               for i, name in enumerate(names)}
    return {"since": clock.describe()["since"],
            "phases_s": {name: every[slowest[name]][i] for i, name in enumerate(names)},
            "slowest_rank": slowest, "to_first_step_s": sum(mine.values()),
            # this rank's, beside the imports: None where no GPU was the device
            "cuda_context_s": cuda_context_times(clock.origin)}


def log_startup(found: dict, previous: dict | None) -> None:
    """One line of the phases (the slowest rank's), and one per phase far over its share
    in the run's previous job."""
    parts = [f"{name} {seconds:.1f}s" + (f" (rank {found['slowest_rank'][name]})"
                                         if found["slowest_rank"][name] else "")
             for name, seconds in found["phases_s"].items()]
    logger.info(f"start-up since {found['since']}: {', '.join(parts)}; first step "
                f"{found['to_first_step_s']:.1f}s after the {found['since']}")
    for line in slower_phases(found["phases_s"], previous):
        logger.warning(line)


def slower_phases(phases: dict[str, float], previous: dict | None) -> list[str]:
    """A line for each phase that took SLOWER_FACTOR times its previous job's and
    SLOWER_BY_S longer (what the previous job's summary.json says, checked)."""
    before = previous.get("phases_s") if isinstance(previous, dict) else None
    lines = []
    for name, seconds in phases.items():
        usual = before.get(name) if isinstance(before, dict) else None
        if (usual is not None and not out_of_range("phase_s", usual)
                and seconds > SLOWER_FACTOR * usual and seconds - usual > SLOWER_BY_S):
            lines.append(f"start-up: {name} took {seconds:.1f}s, "
                         f"{seconds / max(usual, 0.1):.0f}x the {usual:.1f}s of this run's "
                         "previous job")
    return lines
