"""The GPU check's benchmark part (workload/bench/kit.py) keeps what it measured: its JSON
is written after each part, a part or a row that fails is named there while the others
still run, and bench says which config it would choose and why."""

from __future__ import annotations

import json
import time
from contextlib import contextmanager
from types import SimpleNamespace

import pytest

from workload.bench import first_step, kit, levers

OOM = "CUDA error: an illegal memory access was encountered"
RATES = {"reference": 100.0, "defaults": 300.0, "compile-blocks": 450.0,
         "max-autotune": 500.0}


def fake_measure(rows, args, cfg, info, meter=None) -> list[dict]:
    """wrn: the reference 100 images/s, defaults 300, per-block compile 450 after 20 s of
    compile, max-autotune 500 (its exact resume untested), the others 200; the
    whole-model compile fails to build. resnet18: the process fails."""
    if args["model"] == "resnet18":
        raise RuntimeError(OOM)
    found = []
    for row in rows:
        out = dict(model=row.model, config=row.config, batch_size=row.batch, status="measured",
                   reason=None, images_per_second=RATES.get(row.config, 200.0),
                   compile_s=20.0 if row.config == "compile-blocks" else None)
        if row.config == "compile":
            out = dict(out, status="failed", reason="build and warm-up: BackendCompilerFailed")
        found.append(out if row.status == "measured" else
                     dict(model=row.model, config=row.config, status=row.status,
                          reason=row.reason))
    return found


@contextmanager
def no_process(args, cfg, flag):
    yield SimpleNamespace(device=None, local_rank=0)


def failing_profile(args: dict) -> dict:
    raise MemoryError("out of memory in the profiled step")


def fake_first_step(device, quick, save) -> dict:
    part = dict(starts=[dict(name="cold", status="measured", phases_s={"imports": 1.0})])
    save(part)
    return part


def pretend_gpu(monkeypatch, measure) -> None:
    """Every config applies, rows measured by `measure`, a failing profile and a quick
    first step: no process, no model."""
    monkeypatch.setattr(levers, "measure_rows", measure)
    monkeypatch.setattr(levers, "not_applicable", lambda config, device, model: None)
    monkeypatch.setattr(kit, "bench_process", no_process)
    monkeypatch.setattr(kit, "profile_step", failing_profile)
    monkeypatch.setattr(first_step, "measure", fake_first_step)


@pytest.fixture
def saved(monkeypatch, tmp_path):
    """run_bench on a pretended GPU (every config applies) with a failing ResNet-18 and
    profile; what its JSON held after each save."""
    pretend_gpu(monkeypatch, fake_measure)
    path = tmp_path / "bench.json"
    states = []

    def save(bench):
        kit.save_result(str(path), {"device": "cpu"}, bench)
        states.append(json.loads(path.read_text()))

    kit.run_bench("cpu", True, save, frozenset({"cudagraphs"}))
    return states


def test_each_part_is_written_as_it_is_measured(saved):
    assert [len(state["bench"]["rows"]) for state in saved] == [0, 7, 7, 7, 7, 7, 8, 8]
    assert saved[1]["bench"]["parts_done"] == ["wrn"]
    assert saved[2]["bench"]["first_step"]["starts"][0]["name"] == "cold"  # mid-part


def test_a_failed_part_and_row_are_named_and_the_other_rows_kept(saved):
    final = saved[-1]["bench"]
    assert [(row["model"], row["config"]) for row in final["rows"]] == [
        ("wrn", config) for config in levers.MAIN] + [("wrn", "max-autotune")]
    rows = {row["config"]: row for row in final["rows"]}
    assert rows["cudagraphs"]["status"] == "not run"
    assert rows["cudagraphs"]["reason"] == "left out (--skip)"
    assert final["errors"] == [
        dict(part="wrn compile", error="build and warm-up: BackendCompilerFailed"),
        dict(part="resnet18", error=f"RuntimeError: {OOM}"),
        dict(part="profile", error="MemoryError: out of memory in the profiled step"),
        dict(part="resnet18 max-autotune", error=f"RuntimeError: {OOM}")]
    assert final["profile"] is None and final["parts_done"] == final["parts"]


def test_bench_chooses_the_fastest_config_with_a_tested_exact_resume_and_says_why(saved):
    choice = saved[-1]["bench"]["choice"]["wrn"]
    assert choice["config"] == "compile-blocks" and choice["vs_defaults"] == 1.5
    assert choice["why"] == ("the fastest measured, 450 images/s, 1.50x train's defaults, "
                             "for 20 s of compile at the start; faster but without a tested "
                             "exact resume: max-autotune")


def test_the_result_says_what_data_was_measured(saved):
    data = saved[0]["bench"]["data"]
    assert data["kind"] == "synthetic" and data["shaped_as"] == "CIFAR-100"
    assert data["images"] == kit.QUICK["synthetic_size"]
    assert data["classes"] == kit.QUICK["num_classes"] and data["channels"] == 3
    assert data["image_size"] == {"wrn": 32, "resnet18": 16}


def test_a_part_still_compiling_at_the_time_limit_ends_and_says_why(monkeypatch, tmp_path):
    """The Wide ResNet's max-autotune still compiling when the kit's --time-limit comes
    (the GPU check's part limit less its reserve): the kit ends, the row and the part
    say why, what was measured before is kept, and the JSON is written."""
    def compiling_on(rows, args, cfg, info, meter=None):
        if any(row.config == "max-autotune" for row in rows):
            time.sleep(60)  # Inductor timing its candidate kernels
        return fake_measure(rows, args, cfg, info, meter)

    pretend_gpu(monkeypatch, compiling_on)
    path = tmp_path / "bench.json"
    began = time.monotonic()
    kit.run_bench("cpu", True, lambda bench: kit.save_result(str(path), {}, bench),
                  frozenset({"resnet18"}), limit_s=2)
    assert time.monotonic() - began < 10
    bench = json.loads(path.read_text())["bench"]
    assert bench["parts_done"] == ["wrn", "first step", "profile"]
    rows = {(row["model"], row["config"]): row for row in bench["rows"]}
    assert rows["wrn", "defaults"]["status"] == "measured"
    late = rows["wrn", "max-autotune"]
    assert late["status"] == "not finished"
    assert "time limit of 2 s" in late["reason"] and "compiled" in late["reason"], late
    assert bench["stopped"].startswith("wrn max-autotune: not finished after 2 s")
    assert bench["errors"][-1] == dict(part="wrn max-autotune", error=bench["stopped"])
