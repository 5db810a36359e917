"""After a preemption signal, how long the loop waits for a background checkpoint writer
that has not answered (workload.checkpoint.stall.StallWatch.stuck), by its state: a
stopped one is left at once, one waiting for its disk (D) up to DISK_WAIT_S, any other
once it used no CPU time for HUNG_S. The state and the clock are stubbed: the real
states are tests/e2e/test_run_inputs.py's fsfreeze and test_checkpoint_own_loop.py's
SIGSTOP."""

from __future__ import annotations

import pytest

from workload.checkpoint import stall
from workload.checkpoint.stall import DISK_WAIT_S, HUNG_S, StallWatch


@pytest.fixture
def clock(monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(stall.time, "monotonic", lambda: now[0])
    return now


def watch_in(monkeypatch, state: str, cpu: int = 5) -> StallWatch:
    watch = StallWatch(pid=4242, step=6)
    monkeypatch.setattr(watch, "_stat", lambda: (state, cpu))
    monkeypatch.setattr(watch, "named", lambda: f"PID 4242, state {state}")
    return watch


def test_a_stopped_writer_is_left_at_once(monkeypatch, clock):
    assert watch_in(monkeypatch, "T").stuck("SIGTERM")


def test_a_writer_waiting_for_its_disk_is_waited_for_up_to_the_budget(monkeypatch, clock,
                                                                      caplog):
    watch = watch_in(monkeypatch, "D")
    caplog.set_level("WARNING", logger="workload")
    assert not watch.stuck("SIGTERM")
    clock[0] += HUNG_S + 4  # no CPU time for longer than HUNG_S: not hung, in D
    assert not watch.stuck("SIGTERM")
    clock[0] += DISK_WAIT_S
    assert watch.stuck("SIGTERM")
    [line] = caplog.messages
    assert line == (f"SIGTERM while the checkpoint writer (PID 4242, state D) holds the save "
                    f"of step 6: waiting up to {DISK_WAIT_S:.0f} s for it to commit (it waits "
                    "for its disk), then leaving without it")


def test_a_sleeping_writer_that_uses_no_cpu_time_is_left_after_hung_s(monkeypatch, clock):
    watch = watch_in(monkeypatch, "S")
    assert not watch.stuck("SIGUSR2")
    clock[0] += HUNG_S
    assert watch.stuck("SIGUSR2")


def test_a_writer_the_disk_lets_go_is_not_hung_for_the_time_it_waited(monkeypatch, clock):
    """14 s in D (a frozen file system), then sleeping with no CPU time yet (its first
    clock tick after the thaw): hung only HUNG_S after it left D. CI once left a save
    the thaw was about to commit, counting the disk's 14 s as the writer's."""
    watch = StallWatch(pid=4242, step=6)
    seen = [("D", 5)]
    monkeypatch.setattr(watch, "_stat", lambda: seen[0])
    assert not watch.stuck("SIGTERM")
    clock[0] += 14
    assert not watch.stuck("SIGTERM")
    seen[0] = ("S", 5)
    clock[0] += 1
    assert not watch.stuck("SIGTERM")
    clock[0] += HUNG_S - 1.5
    assert not watch.stuck("SIGTERM")
    clock[0] += 1
    assert watch.stuck("SIGTERM")
