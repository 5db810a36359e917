"""Start-up phases: the clock starts at the process's start (or the job's), the phases
follow the marks, a slow phase against the previous job is named, and diagnose reads a
rank's record."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from tests.helpers import REPO
from workload.diagnose.records import Skipped, startup
from workload.diagnose.verdict import start_up
from workload.training.startup import (BEFORE, StartupClock, process_start, record_name,
                                       slower_phases)


def test_the_clock_starts_when_the_process_started_not_when_it_asks():
    """A child that sleeps before asking still reports the moment it was started."""
    before = time.time()
    done = subprocess.run([sys.executable, "-c", "import time; time.sleep(1.5); "
                           "from workload.training.startup import process_start; "
                           "print(process_start())"], capture_output=True, text=True,
                          check=True, cwd=REPO)
    assert abs(float(done.stdout) - before) < 0.5, (done.stdout, before)


def test_every_reading_of_the_process_start_is_the_same_moment():
    """Computed afresh, the start moved from one reading to the next (by up to 10 ms, and
    more under load): a phase measured against one reading and a whole second taken from
    another crossed that second (8.0000026 s where at most 8 can be)."""
    first = process_start()
    readings = set()
    for _ in range(50):
        time.sleep(0.001)
        readings.add(process_start())
    assert readings == {first}


def test_a_forked_child_reads_its_own_start():
    parent = process_start()
    time.sleep(0.05)  # the child starts visibly later than this process
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # the child: its start, then out without pytest's cleanup
        os.write(write, repr(process_start()).encode())
        os._exit(0)
    os.close(write)
    forked_at = time.time()
    os.waitpid(child, 0)
    started = float(os.read(read, 64))
    os.close(read)
    assert started != parent and abs(started - forked_at) < 0.5, (parent, started, forked_at)


def test_phases_follow_the_marks_and_the_job_start_comes_first(tmp_path):
    started = process_start()
    # SLURM's job start is in whole seconds: the job started 7 to 8 s before this process.
    clock = StartupClock(tmp_path / "diagnostics" / "startup-rank-0.json",
                         env={"SLURM_JOB_START_TIME": str(int(started) - 7)})
    clock.mark("imports")
    clock.mark("process group")
    phases = clock.phases()
    assert list(phases) == [BEFORE, "imports", "process group"]
    assert 7 <= phases[BEFORE] < 8, (started, clock.origin)
    assert sum(phases.values()) == pytest.approx(clock.marks[-1][1] - clock.job)
    record = json.loads((tmp_path / "diagnostics" / "startup-rank-0.json").read_text())
    assert record["last_phase"] == "process group" and record["since"] == "job start"


def test_a_start_up_that_fails_keeps_its_error_and_node_until_the_first_step(tmp_path,
                                                                              monkeypatch):
    """The record says how the rank failed before its first step (a GPU that fails as it
    is first used), where diagnose's decision reads it; after that, the stall watchdog's
    last heartbeat does."""
    monkeypatch.setenv("SLURMD_NODENAME", "nid002")
    path = tmp_path / "diagnostics" / "startup-rank-1.json"
    clock = StartupClock(path)
    clock.mark("imports")
    clock.failed(RuntimeError("CUDA error: uncorrectable ECC error encountered"))
    record = json.loads(path.read_text())
    assert (record["error"], record["host"]) == (
        "RuntimeError: CUDA error: uncorrectable ECC error encountered", "nid002")
    read = startup(path.read_bytes(), 1)
    assert (read["startup_error"], read["startup_host"]) == (record["error"], "nid002")
    clock = StartupClock(path)
    clock.mark("first step")
    clock.failed(RuntimeError("CUDA error: unspecified launch failure"))
    assert "error" not in json.loads(path.read_text())


def test_no_record_is_written_where_the_run_folder_does_not_exist(tmp_path):
    clock = StartupClock(tmp_path / "run" / "diagnostics" / "startup-rank-0.json")
    clock.mark("imports")
    assert not (tmp_path / "run").exists()


def test_the_record_is_named_by_the_launch_rank():
    assert record_name({"RANK": "3", "SLURM_PROCID": "1"}) == "startup-rank-3.json"
    assert record_name({"SLURM_PROCID": "5"}) == "startup-rank-5.json"
    for bad in ("../x", "²", "9" * 5000):  # the launch layer names these; not this name
        assert record_name({"RANK": bad}) == "startup-rank-0.json"


def test_a_phase_far_over_the_previous_jobs_is_named_once():
    previous = {"phases_s": {"data": 20.0, "model": 1.0, "imports": "x"}}
    lines = slower_phases({"data": 95.0, "model": 5.0, "imports": 50.0}, previous)
    assert lines == ["start-up: data took 95.0s, 5x the 20.0s of this run's previous job"]
    assert slower_phases({"data": 95.0}, None) == []
    assert slower_phases({"data": 95.0}, {"phases_s": [1]}) == []


def test_diagnose_reads_the_record_and_names_the_phase_after_the_last():
    data = json.dumps({"last_phase": "data", "at": 0}).encode()
    assert startup(data, 0) == {"startup_last": "data", "startup_at": 0}
    assert start_up("data", 0) == "start-up: finished data at 00:00:00 UTC, then in model"
    for bad in ({"last_phase": "lunch", "at": 0}, {"last_phase": "data", "at": "noon"},
                {"last_phase": "data", "at": True}):
        with pytest.raises(Skipped):
            startup(json.dumps(bad).encode(), 0)


def test_the_compilers_share_is_split_out_of_the_first_step(monkeypatch):
    from workload.training import startup as module

    monkeypatch.setattr(module, "compile_seconds", lambda: 0.02)
    clock = StartupClock()
    clock.mark("resume")
    time.sleep(0.1)
    clock.mark("first step")
    phases = clock.phases()
    assert list(phases)[-3:] == ["resume", "compile", "first step"]
    assert phases["compile"] == 0.02 and phases["first step"] >= 0.07
    assert sum(phases.values()) == pytest.approx(clock.marks[-1][1] - clock.origin)
    monkeypatch.setattr(module, "compile_seconds", lambda: 1e9)  # never more than the step
    clock.mark("first step")
    assert clock.phases()["first step"] == 0.0


def test_the_autotuning_step_leaves_the_model_and_the_random_state_as_they_were():
    """cudnn autotune's step (one forward and backward before the first one) is undone:
    BatchNorm's statistics, the gradients, the mode and the random state are as before,
    so a run trains the same with the phase as without it (here on the CPU, where train
    itself skips it: nothing is tuned there)."""
    import torch

    from workload.models import build_model
    from workload.precision import autotune_convolutions, one_step_undone

    torch.manual_seed(0)
    model = build_model("wrn", num_classes=4, width=8, blocks_per_stage=1).eval()
    before = {name: t.clone() for name, t in model.state_dict().items()}
    rng = torch.get_rng_state()
    one_step_undone(model, (4, 3, 16, 16), True, "fp32", torch.device("cpu"))
    assert torch.equal(torch.get_rng_state(), rng) and not model.training
    assert all(p.grad is None for p in model.parameters())
    after = model.state_dict()
    assert all(torch.equal(before[name], after[name]) for name in before)
    assert not autotune_convolutions(model, (4, 3, 16, 16), False, "fp32",
                                     torch.device("cpu"))


def test_no_cuda_context_thread_where_the_cpu_is_the_device():
    """CUDA's context is started early (in a thread, during the imports) only where a GPU
    is the device: none for --device cpu, nor for auto without a GPU."""
    import threading

    import torch

    from workload.training.startup import CUDA_CONTEXT, start_cuda_context

    threads = threading.active_count()
    assert start_cuda_context("cpu") is None
    if not torch.cuda.is_available():
        assert start_cuda_context("auto") is None
    assert threading.active_count() == threads and "ready" not in CUDA_CONTEXT


def test_the_model_is_built_on_its_device_not_moved_there(monkeypatch):
    """place_model builds the network under its device (torch.device as a context), so a
    GPU run's weights are made on the GPU, not made on the CPU and copied; shown with the
    meta device, where the CPU is the default otherwise."""
    import torch

    import workload.training.build as build
    from workload.config import build_config
    from workload.distributed import DistInfo

    built_under = []

    def recording(cfg, num_classes):
        built_under.append(torch.get_default_device())
        return real(cfg, num_classes)

    real = build.model_for
    monkeypatch.setattr(build, "model_for", recording)
    cfg = build_config({"model": "wrn", "width": 8, "blocks_per_stage": 1,
                        "dataset": "synthetic"}, "cpu")
    model = build.place_model(cfg, DistInfo.alone(torch.device("meta")), num_classes=4)
    assert built_under == [torch.device("meta")]
    assert {p.device.type for p in model.parameters()} == {"meta"}
