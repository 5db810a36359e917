"""A command's start-up runs with Python's cyclic collector paused, its loops with the
collector on, and its exit with what is left frozen (workload/commands.py says why); a
program that runs a command in its own process finds the collector as it left it."""

from __future__ import annotations

import gc
import subprocess
import sys
from unittest import mock

import pytest

from tests.helpers import DIGITS_RUN, REPO, run_train
from workload.commands import collector_paused_for_start_up, run_command, start_up_over


@pytest.fixture
def collector_restored():
    """Each test leaves the pytest process's collector as it found it, nothing frozen."""
    enabled = gc.isenabled()
    yield
    gc.unfreeze()
    (gc.enable if enabled else gc.disable)()


def test_the_work_runs_paused_and_the_caller_gets_the_collector_back(collector_restored):
    gc.enable()
    gc.unfreeze()
    seen = []
    assert run_command("test", lambda _early: seen.append(gc.isenabled())) == 0
    assert seen == [False]
    assert gc.isenabled()
    assert gc.get_freeze_count() == 0  # the caller's objects are not pinned for it


def test_a_collector_the_caller_switched_off_stays_off(collector_restored):
    gc.disable()
    with collector_paused_for_start_up():
        start_up_over()
        assert not gc.isenabled()
    assert not gc.isenabled()


def test_a_command_run_by_a_command_leaves_the_pause_to_the_outer_one(collector_restored):
    gc.enable()
    with collector_paused_for_start_up():
        with collector_paused_for_start_up():
            pass
        assert not gc.isenabled()  # the outer command's start-up goes on paused
    assert gc.isenabled()


def test_the_loop_runs_with_the_collector_on_and_the_start_up_frozen(collector_restored):
    gc.enable()
    gc.unfreeze()
    with collector_paused_for_start_up():
        made = [object() for _ in range(10)]  # noqa: F841 - tracked objects of the start-up
        start_up_over()
        assert gc.isenabled()
        assert gc.get_freeze_count() > 0
        start_up_over()  # once over, a second call changes nothing
        assert gc.isenabled()


def recording(original, states: list):
    """`original`, noting whether the collector is on each time it is called."""
    def wrapper(*args, **kwargs):
        states.append((original.__name__, gc.isenabled()))
        return original(*args, **kwargs)
    return wrapper


@pytest.mark.slow
def test_a_training_loop_and_its_evaluation_run_with_the_collector_on(tmp_path,
                                                                      collector_restored):
    from workload.training import trainer

    states = []
    with (mock.patch.object(trainer.Trainer, "train_epoch",
                            recording(trainer.Trainer.train_epoch, states)),
          mock.patch.object(trainer, "evaluate_model",
                            recording(trainer.evaluate_model, states))):
        run_train([*DIGITS_RUN, "--max-steps", "1"], tmp_path / "run")
    assert states and all(enabled for _, enabled in states), states
    assert {name for name, _ in states} == {"train_epoch", "evaluate_model"}, states


@pytest.mark.slow
def test_predict_runs_its_batches_with_the_collector_on(digits_run, tmp_path,
                                                        collector_restored):
    from PIL import Image

    from workload import predict

    for name in ("a.png", "b.png"):
        Image.new("RGB", (16, 16), (40, 90, 200)).save(tmp_path / name)
    states = []
    with mock.patch.object(predict, "predict_batch", recording(predict.predict_batch, states)):
        assert predict.main([str(digits_run), str(tmp_path)]) == 0
    assert states == [("predict_batch", True)]


def test_bench_times_its_work_with_the_collector_on(collector_restored):
    import torch

    from workload.bench.common import timed

    seen = []
    with collector_paused_for_start_up():
        timed(torch.device("cpu"), lambda: seen.append(gc.isenabled()))
    assert seen == [True]


def test_the_exit_finds_the_rest_frozen():
    # An exit handler registered before the command runs after the command's own.
    script = ("import atexit, gc\n"
              "atexit.register(lambda: print('frozen at exit:', gc.get_freeze_count() > 0))\n"
              "from workload.commands import run_command\n"
              "run_command('test', lambda _early: None)\n")
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "frozen at exit: True", done.stdout
