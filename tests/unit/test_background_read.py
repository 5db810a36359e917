"""The energy counter's reader thread (workload/training/background_read.py): the loop's
reading never waits for the counter, a fresh one always does, and a failure reaches the
caller."""

from __future__ import annotations

import itertools
import threading
import time

import pytest

from workload.training.background_read import BackgroundReader

SLOW_S = 0.2


def slow_counter():
    """A counter that takes SLOW_S per reading and counts its readings: 1, 2, 3, ..."""
    count = itertools.count(1)

    def read():
        time.sleep(SLOW_S)
        return float(next(count))
    return read


def timed(call):
    start = time.perf_counter()
    return call(), time.perf_counter() - start


def test_latest_answers_at_once_with_the_newest_reading_and_its_time():
    reader = BackgroundReader(slow_counter(), "test-counter")
    before = time.perf_counter()
    assert reader() == 1.0  # the first reading, waited for; the second starts
    (value, at), took = timed(reader.latest)
    assert value == 1.0 and before < at < time.perf_counter() and took < SLOW_S / 4
    time.sleep(SLOW_S * 2)
    (value, later), took = timed(reader.latest)
    assert value == 2.0 and later > at and took < SLOW_S / 4


def test_a_fresh_reading_is_one_started_after_the_call():
    def started_at():  # the counter's value: when its reading began
        began = time.perf_counter()
        time.sleep(SLOW_S)
        return began
    reader = BackgroundReader(started_at, "test-counter")
    reader()
    reader.latest()  # a reading starts now, in the background
    called = time.perf_counter()
    assert reader() >= called


def test_latest_before_any_reading_waits_for_the_first():
    reader = BackgroundReader(slow_counter(), "test-counter")
    assert reader.latest()[0] == 1.0


def test_a_failing_counter_raises_in_the_caller_and_its_thread_ends():
    values = iter([5.0, OSError("NVML: GPU is lost")])

    def read():
        value = next(values)
        if isinstance(value, Exception):
            raise value
        return value
    reader = BackgroundReader(read, "failing-counter")
    assert reader() == 5.0
    reader.latest()
    with pytest.raises(OSError, match="GPU is lost"):
        reader()
    with pytest.raises(OSError, match="GPU is lost"):
        reader.latest()
    assert "failing-counter" not in {t.name for t in threading.enumerate()}
