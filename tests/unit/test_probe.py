"""The loop's probe on its own: the phases the named points set, the data wait and own
work it adds up, the steps and images; and that the loop writes nothing else (its call
sites are the probe's methods). The CUDA path: tests/gpu/test_stragglers_gpu.py."""

from __future__ import annotations

import re
import time

import pytest

import torch.nn as nn

from workload.training.probe import StepProbe
from workload.training.watchdog import (CHECKPOINT, COMPUTE, DATA, OPTIMIZER, STARTUP,
                                        Activity)


def test_the_named_points_set_the_phase_and_add_up_data_wait_and_own_work():
    probe = StepProbe(step=7)
    assert isinstance(probe, Activity) and (probe.step, probe.phase) == (7, STARTUP)
    probe.step_start()
    assert probe.phase == DATA
    time.sleep(0.02)
    probe.data_ready()
    probe.forward_start()
    assert probe.phase == COMPUTE
    time.sleep(0.02)  # forward: own work
    probe.backward_start()
    time.sleep(0.05)  # backward: DDP's all-reduce waits here, not own work
    probe.optimizer_start()
    assert probe.phase == OPTIMIZER
    time.sleep(0.01)
    probe.step_end(8, images=16)
    assert (probe.step, probe.images) == (8, 16)
    assert 0.02 <= probe.data_s < 0.05
    assert 0.03 <= probe.busy_total_s() < 0.06  # forward and optimizer, not backward
    assert probe.enter(CHECKPOINT) == OPTIMIZER and probe.phase == CHECKPOINT


def test_intervals_are_read_as_differences_of_the_running_sums():
    probe = StepProbe()
    for step in (1, 2, 3):
        probe.step_start()
        probe.data_ready()
        probe.forward_start()
        probe.backward_start()
        probe.optimizer_start()
        probe.step_end(step, images=4)
    first = probe.busy_total_s()
    assert first >= 0 and probe.busy_total_s() == first  # a read adds nothing
    assert (probe.step, probe.images) == (3, 12)


def test_under_ddp_the_modules_forward_hook_marks_the_forward():
    wrapper = nn.Module()
    wrapper.module = nn.Linear(2, 2)
    probe = StepProbe()
    probe.watch_forward(wrapper)
    probe.forward_start()  # the hook's to mark, not this call's
    assert probe._forward is None
    wrapper.module(__import__("torch").zeros(1, 2))
    assert probe._forward is not None


def test_the_loop_writes_nothing_but_the_probes_points():
    import inspect

    from workload.training import trainer
    source = inspect.getsource(trainer)
    assert not re.search(r"probe\.\w+\s*=[^=]", source), "a field written by the loop"
    assert "activity" not in source.lower()


def test_own_work_on_the_host_adds_the_spans_between_marks():
    activity = StepProbe()
    start = activity.mark()
    end = activity.mark()
    activity.add_busy(start, end)
    activity.add_busy(1.0, 1.25)
    assert activity.busy_total_s() == pytest.approx(end - start + 0.25)
    assert activity.gpu_spans == []


def steps(probe: StepProbe, first: int, last: int, images: int = 4, hooks_s: float = 0.0):
    """The loop's points for steps first..last; each step's hooks take `hooks_s`."""
    for step in range(first, last + 1):
        probe.step_start()
        probe.data_ready()
        probe.forward_start()
        probe.backward_start()
        probe.optimizer_start()
        probe.step_end(step, images)
        time.sleep(hooks_s)
    probe.step_start()  # where the loop waits for the next batch


def test_the_window_leaves_out_the_jobs_first_step_and_its_hooks():
    probe = StepProbe(step=5)  # a resumed job: its first step is 6
    probe.open_window()
    steps(probe, 6, 6, hooks_s=0.1)  # the first step's hooks (a compile cache packed)
    time.sleep(0.05)
    steps(probe, 7, 9)
    window = probe.close_window()
    assert window.images == 12 and probe.images == 16  # three timed steps, four trained
    assert window.first_step_s >= 0.1 and 0.05 <= window.seconds < window.epoch_s
    assert window.epoch_s == pytest.approx(window.first_step_s + window.seconds)
    probe.open_window()  # the next epoch: every step timed, no first step in it
    steps(probe, 10, 11)
    window = probe.close_window()
    assert window.images == 8 and window.first_step_s is None
    assert window.seconds == pytest.approx(window.epoch_s)


def test_the_progress_lines_interval_is_a_lap_of_the_window():
    probe = StepProbe(step=5)
    probe.open_window()
    steps(probe, 6, 6, hooks_s=0.1)  # the job's first step: left out, as from the window
    steps(probe, 7, 8, hooks_s=0.02)
    lap = probe.lap()
    assert (lap.steps, lap.images) == (2, 8) and 0.04 <= lap.seconds < 0.1
    steps(probe, 9, 9)
    assert (probe.lap().steps, probe.lap().steps) == (1, 0)  # each lap begins the next
    steps(probe, 10, 10)
    probe.open_window()  # a new epoch: the evaluation before it is in no interval
    assert probe.lap().steps == 0


class Numbers:
    """A contributor to the interval exchange that records what it was asked."""

    def __init__(self, name: str, width: int):
        self.name, self.width, self.calls = name, width, []

    def start(self) -> None:
        self.calls.append("start")

    def numbers(self, steps: int) -> list[float]:
        self.calls.append(steps)
        return [float(steps)] * self.width

    def read(self, rows, step: int) -> dict:
        return {self.name: rows, f"{self.name}_step": step}


def test_the_interval_exchange_gives_each_contributor_its_own_columns():
    import torch

    from workload.training.interval import IntervalExchange
    from workload.training.trainer import StepDone
    probe = StepProbe(step=4)
    a, b = Numbers("a", 2), Numbers("b", 3)
    exchange = IntervalExchange(probe, 3, torch.device("cpu"), True, [a, b])
    assert a.calls == b.calls == ["start"] and exchange.latest_record() == {}
    for step in range(5, 10):
        exchange(StepDone(0, step, step, 4, torch.zeros(())))
    assert a.calls == b.calls == ["start", 2, 3]  # steps 6 (two since 4) and 9 (three)
    assert exchange.latest_record() == {"a": [[3.0, 3.0]], "a_step": 9,
                                        "b": [[3.0, 3.0, 3.0]], "b_step": 9}


def test_the_progress_line_keeps_no_clock_of_its_own():
    """Its interval's seconds are the probe's laps: one clock for a step."""
    import inspect

    from workload.training import progress
    source = inspect.getsource(progress)
    for word in ("import time", "perf_counter", "monotonic", "time()", "synchronize"):
        assert word not in source, word


def test_the_loop_keeps_no_clock_and_writes_no_output():
    """The probe is the loop's one clock, and what the loop shows is its hooks'."""
    import inspect

    from workload.training import trainer
    source = inspect.getsource(trainer)
    for word in ("perf_counter", "synchronize", "Progress", "print(", "append_jsonl"):
        assert word not in source, word
    assert len(inspect.getsource(trainer.Trainer.train_epoch).splitlines()) <= 25
