"""The stall watchdog of every rank of `train` (docs/hangs.md).

The loop's probe (workload.training.probe) says where it is in an `Activity` (the step
count and the phase): attribute writes, no syscall, no lock per step. A daemon thread
looks at it every few seconds (every second until it has seen a step done): it learns
the step time from how fast the count moves, writes the rank's heartbeat
(``diagnostics/heartbeat-<rank>.json``: step, phase, host, pid, the attempt) when
something changed or every HEARTBEAT_EVERY seconds, and a last one when the run ends. Once
it has seen a step done, when no step completes within the stall timeout
(``--stall-timeout``, or 10 x the median step if that is longer), it writes every
thread's Python stack, the step and the phase to ``diagnostics/rank-<rank>.txt`` with
the flight recorder's record of this rank's collectives (``fr-rank-<rank>.json``), logs
one line, and leaves the rest to the collective timeout. `diagnose RUN_DIR` reads them.

The line is logged first and the files are written by a second thread (`FileWriter`):
a file system that hangs (a Lustre or NFS server gone) blocks that thread, never the
looks, so the stall line still comes, and a second one names the folder a write hangs in.
"""

from __future__ import annotations

import faulthandler
import json
import os
import statistics
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path

import torch

from workload import distributed
from workload.files import open_append, write_json
from workload.held import let_go
from workload.launch.diagnostics import (EXITED, FINISHED, STALL_MARK, dump_command, error_text,
                                         heartbeat_file, hold_diagnostics, stacks_file)
from workload.launch.variables import node_name
from workload.logs import logger

# The phases the loop reports (diagnose prints them as they are).
STARTUP = "start-up"
DATA = "data wait"
COMPUTE = "forward/backward"
OPTIMIZER = "optimizer"
COLLECTIVE = "collective"
CHECKPOINT = "checkpoint"
EVALUATION = "evaluation"
STARTUP_POLL_S = 1.0     # until the first step: a rank frozen soon after still shows it
HEARTBEAT_EVERY = 30.0   # seconds: an unchanged heartbeat is rewritten this often
STEP_FACTOR = 10         # the stall timeout is at least this many median steps
HUNG_WRITE_S = 5.0       # a write into the diagnostics folder this slow is named
FR_KEPT = 100            # the flight recorder's last entries kept in fr-rank-<N>.json


class Activity:
    """What the watchdog reads of a rank: its step count and its phase (the loop's
    probe, workload.training.probe.StepProbe, writes them)."""

    __slots__ = ("step", "phase")

    def __init__(self, step: int = 0):
        self.step = step
        self.phase = STARTUP


class FileWriter:
    """The watchdog's files, written on a thread of their own once `start`ed (before, and
    after `close`, in the caller's). Only the newest job of each kind waits: a heartbeat
    replaces the one a hung write still holds back."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.jobs: dict[str, Callable[[], None]] = {}
        self.busy_since: float | None = None
        self.running = False
        self._changed = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="stall-watchdog-files",
                                        daemon=True)

    def start(self) -> None:
        self.running = True
        self._thread.start()

    def submit(self, kind: str, job: Callable[[], None]) -> None:
        if not self.running:
            job()
            return
        with self._changed:
            self.jobs[kind] = job
            self._changed.notify_all()

    def busy(self) -> bool:
        """Whether its thread is still in a write (a hung file system)."""
        return self._thread.is_alive()

    def stuck_s(self, now: float) -> float:
        """How long the write in progress has taken (0 when none is)."""
        since = self.busy_since
        return 0.0 if since is None else now - since

    def close(self, timeout_s: float) -> None:
        """Write what waits, for at most `timeout_s` (a hung write is left behind)."""
        with self._changed:
            self.running = False
            self._changed.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout=timeout_s)

    def _run(self) -> None:
        while True:
            with self._changed:
                self._changed.wait_for(lambda: self.jobs or not self.running)
                if not self.jobs:
                    return
                job = self.jobs.pop(next(iter(self.jobs)))
                self.busy_since = time.monotonic()
            try:
                job()
            except OSError as exc:  # a full or vanished disk must not stop the training
                logger.warning(f"stall watchdog: cannot write into {self.folder} ({exc})")
            finally:
                self.busy_since = None


class StallWatchdog:
    """The thread; `check(now)` is one look (called by the thread, or by a test)."""

    def __init__(self, activity: Activity, folder: Path, rank: int, world_size: int,
                 timeout_s: float, attempt: float = 0.0, reached: Path | None = None,
                 waited_writer: Callable[[], object | None] = lambda: None):
        self.activity = activity
        # The checkpoint writer process the loop waits for now, None while it waits for
        # none (workload.checkpoint.session's Session.waited_writer): named in the stall
        # line, with what to do.
        self.waited_writer = waited_writer
        self.folder = folder
        self.reached = reached or folder  # where it is opened (RunFolder.diagnostics_reached)
        self.timeout_s = timeout_s
        self.rank = rank
        self.world_size = world_size
        self.attempt = attempt
        self.host = node_name()
        self.poll_s = min(5.0, timeout_s / 5) if timeout_s else 5.0
        self.step_times: deque[float] = deque(maxlen=100)
        self.last_step = activity.step
        self.last_change = time.monotonic()
        self.stepping = False  # start-up and the first step are the collective timeout's
        self.written: tuple = ()
        self.written_at = 0.0
        self.dumped = self.hang_named = False
        self.files = FileWriter(folder)
        self.held = folder  # the held path once entered (launch.diagnostics.hold_diagnostics)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="stall-watchdog", daemon=True)

    def __enter__(self) -> StallWatchdog:
        # Written through its held path; `folder` is the name said in messages.
        self.held = hold_diagnostics(self.reached)
        self.check(time.monotonic())  # the heartbeat is there before the first step
        self.files.start()
        self._thread.start()
        return self

    def __exit__(self, kind, error, _traceback) -> None:
        self._stop.set()
        self._thread.join(timeout=self.poll_s + 1)
        # A rank that ends stalled (its collective timed out, say) says so to the end:
        # diagnose tells it from the rank that froze by the stall dumps of those still on
        # (it read the collective's position instead when this exit came in time).
        self.dumped = self.dumped and kind is not None
        # The last word, after any heartbeat still waiting: diagnose must not show a
        # finished run's last poll. A failure's error goes with it: diagnose's decision
        # leaves the node behind when it is a broken GPU's (workload/diagnose/hardware.py).
        self.write_heartbeat(self.activity.step, FINISHED if kind is None else EXITED,
                             error_text(error))
        self.files.close(timeout_s=HEARTBEAT_EVERY)
        if not self.files.busy():  # a hung write still goes through the descriptor
            let_go(self.held)

    def next_look_s(self) -> float:
        """Seconds to the next look: every second until a step is seen done, so a rank
        that freezes soon after its first steps has a heartbeat past step 0."""
        return self.poll_s if self.stepping else min(STARTUP_POLL_S, self.poll_s)

    def _run(self) -> None:
        while not self._stop.wait(self.next_look_s()):
            self.check(time.monotonic())

    def limit_s(self) -> float:
        """The stall timeout: the flag's, or 10 x the median step when that is longer."""
        median = statistics.median(self.step_times) if self.step_times else 0.0
        return max(self.timeout_s, STEP_FACTOR * median)

    def check(self, now: float) -> None:
        step = self.activity.step
        phase = self.activity.phase
        if step != self.last_step:
            if step > self.last_step and self.stepping:
                self.step_times.append((now - self.last_change) / (step - self.last_step))
            self.last_step = step
            self.last_change = now
            self.dumped = False
            self.stepping = True
        stalled = now - self.last_change
        # Once a step is done the flag's timeout applies, timed steps or not: a hang at
        # the first checkpoint or collective comes before a second step is seen.
        if self.timeout_s and self.stepping and not self.dumped and stalled > self.limit_s():
            self.dumped = True
            self.written = ()  # the heartbeat says so at once
            # The line first: the files may never come when the file system hangs.
            logger.warning(f"rank {self.rank} on {self.host}: no step done for {stalled:.0f} s "
                           f"(step {step}, phase {phase}); stacks in "
                           f"{stacks_file(self.folder, self.rank)}; {self.what_to_do()}")
            reason = f"{STALL_MARK} no step done for {stalled:.0f} s"
            self.files.submit("dump", lambda: self.dump(reason, step, phase))
        self.name_hung_write(now)
        if (step, phase) != self.written or now - self.written_at >= HEARTBEAT_EVERY:
            self.write_heartbeat(step, phase)
            self.written = (step, phase)
            self.written_at = now

    def what_to_do(self) -> str:
        """The stall line's advice: a collective's timeout ends a rank that waits for
        another, but not one that waits for its own checkpoint writer (a stopped or hung
        process), which is named instead, nor a run of one process, which has no
        collective to time out (a hung file system holds it for as long as it hangs)."""
        writer = self.waited_writer()
        if writer is not None:
            return f"waiting for {writer.waiting()}"
        if self.world_size == 1:
            return ("one process: no collective timeout will end it; if it does not go on, "
                    "stop it (Ctrl-C, scancel) and run: " + dump_command(self.folder))
        return f"after the collective timeout run: {dump_command(self.folder)}"

    def name_hung_write(self, now: float) -> None:
        """One line when a write into the folder has not returned for HUNG_WRITE_S: the
        stall dump (or heartbeat) will not come until the file system answers."""
        stuck = self.files.stuck_s(now)
        if stuck < HUNG_WRITE_S:
            self.hang_named = False
        elif not self.hang_named:
            self.hang_named = True
            logger.warning(f"rank {self.rank} on {self.host}: a write into {self.folder} has "
                           f"hung for {stuck:.0f} s: is its file system hung (a Lustre or NFS "
                           f"server)? Its stall dump and heartbeat come when it answers")

    def write_heartbeat(self, step: int, phase: str, error: str = "") -> None:
        """The heartbeat as it is now, written by the file writer."""
        median = statistics.median(self.step_times) if self.step_times else None
        beat = dict(rank=self.rank, world_size=self.world_size, host=self.host,
                    pid=os.getpid(), step=step, phase=phase, time=time.time(),
                    median_step_s=median, stalled=self.dumped, attempt=self.attempt,
                    **({"error": error} if error else {}))
        self.files.submit("heartbeat",
                          lambda: write_json(heartbeat_file(self.held, self.rank), beat))

    def dump(self, reason: str, step: int, phase: str) -> None:
        """Every thread's stack with the step and phase, and the flight recorder."""
        with open_append(stacks_file(self.held, self.rank)) as stream:
            stream.write(f"{reason}; rank {self.rank} on {self.host}, pid {os.getpid()}, "
                         f"step {step}, phase {phase}, at {time.strftime('%FT%T%z')}\n")
            stream.flush()
            faulthandler.dump_traceback(stream, all_threads=True)
            stream.write("\n")
        record = flight_record()
        if record is not None:
            write_json(self.held / f"fr-rank-{self.rank}.json", record)


def attempt_id(is_main: bool, device: torch.device) -> float:
    """Rank 0's clock as this attempt starts, the same on every rank (a collective): the
    heartbeats of an earlier attempt, left in the folder, carry another one, and diagnose
    leaves them out."""
    mine = torch.tensor(time.time() if is_main else 0.0, dtype=torch.float64, device=device)
    return float(distributed.all_reduce_sum(mine).item())


def flight_record() -> dict | None:
    """This rank's flight recorder as JSON (never a pickle), None when there is none."""
    if "torch.distributed" not in sys.modules:  # no process group without it
        return None
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        return None
    try:
        from torch._C._distributed_c10d import _dump_fr_trace_json
        record = json.loads(_dump_fr_trace_json(True, True))
    except (ImportError, RuntimeError, ValueError):
        return None
    record["entries"] = record.get("entries", [])[-FR_KEPT:]
    return record
