"""A slow counter read on a thread of its own, so the training loop never waits for it.

NVML's total-energy call took 3.8 ms on an H200 (driver 580.159.04, 2026-11-26; power,
temperature and handle calls about 1 us): read at every log interval on the loop's thread,
it cost 0.4 % of a 50-step interval of 17 ms steps, four times the 0.1 % the loop's
measurements are held to (docs/performance.md). With this reader the log interval takes
the reading its previous call started, with the time it was taken (so an interval's
figures are those of the interval before it), and starts the next; a checkpoint and the
end of the run, which need the counter as it is now, wait for a fresh reading.

One thread does every reading, so readings come in the order they were asked for and a
cumulative counter never seems to go backwards because two reads overlapped.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


class BackgroundReader:
    """`read` called on a daemon thread: `latest()` is instant and starts the next reading,
    `fresh()` (or a call) waits for a new one. An exception of `read` is raised by the next call
    of either, and ends the thread."""

    def __init__(self, read: Callable[[], float], name: str):
        self._read = read
        self._changed = threading.Condition()
        self._asked = self._done = 0  # reading numbers: asked for, and the last finished
        self._reading: tuple[float, float] | None = None  # the value, when it was read
        self._error: BaseException | None = None
        threading.Thread(target=self._serve, name=name, daemon=True).start()

    def __call__(self) -> float:
        return self.fresh()[0]

    def fresh(self) -> tuple[float, float]:
        """A reading begun after this call and its time: waits for it."""
        with self._changed:
            self._asked += 1
            wanted = self._asked
            self._changed.notify_all()
            self._changed.wait_for(lambda: self._done >= wanted or self._error is not None)
            return self._result()

    def latest(self) -> tuple[float, float]:
        """The newest finished reading and its time (time.perf_counter), at once; the
        next reading starts, unless one is under way."""
        with self._changed:
            if self._reading is None and self._error is None:  # none yet: wait for one
                self.fresh()
            reading = self._result()
            self._asked = max(self._asked, self._done + 1)
            self._changed.notify_all()
            return reading

    def _result(self) -> tuple[float, float]:
        if self._error is not None:
            raise self._error
        return self._reading

    def _serve(self) -> None:
        while True:
            with self._changed:
                self._changed.wait_for(lambda: self._asked > self._done)
                serving = self._asked  # every request up to here was made before the read
            try:
                begun = time.perf_counter()
                value = self._read()
                error = None
            except Exception as failure:  # noqa: BLE001 - handed to the caller
                value = None
                error = failure
            with self._changed:
                self._reading = (value, (begun + time.perf_counter()) / 2)
                self._error = error
                self._done = serving
                self._changed.notify_all()
            if error is not None:
                return
