"""The GPU check's benchmark part (workload/bench/kit.py) keeps what it measured: its JSON
is written after each model's row, and a model or profile that fails is named there while
the others still run."""

from __future__ import annotations

import json

import pytest

from workload.bench import kit


def fake_results(args: dict) -> dict:
    if args["model"] == "resnet18":
        raise RuntimeError("CUDA error: an illegal memory access was encountered")
    result = dict(images_per_second=100.0, batch_size=4, precision="fp32", vs_reference=1.0,
                  achieved_tflops=0.1, channels_last=False, pipeline="device",
                  flops_per_image=1e9)
    return {"reference": result, "optimised": dict(result, images_per_second=300.0,
                                                   vs_reference=3.0, precision="bf16")}


def failing_profile(args: dict) -> dict:
    raise MemoryError("out of memory in the profiled step")


@pytest.fixture
def saved(monkeypatch, tmp_path):
    """run_bench with a failing ResNet-18 and profile; what its JSON held after each save."""
    monkeypatch.setattr(kit, "bench_train", fake_results)
    monkeypatch.setattr(kit, "profile_step", failing_profile)
    path = tmp_path / "bench.json"
    states = []

    def save(bench):
        kit.save_result(str(path), {"device": "cpu"}, bench)
        states.append(json.loads(path.read_text()))

    kit.run_bench("cpu", True, save)
    return states


def test_each_row_is_written_as_it_is_measured(saved):
    assert [len(state["bench"]["rows"]) for state in saved] == [0, 1, 1, 1]
    assert saved[1]["bench"]["rows"][0]["model"] == "wrn"


def test_a_failed_model_and_profile_are_named_and_the_other_rows_kept(saved):
    final = saved[-1]["bench"]
    assert [row["model"] for row in final["rows"]] == ["wrn"]
    assert final["rows"][0]["ratio"] == 3.0 and final["rows"][0]["reference_precision"] == "fp32"
    assert final["errors"] == [
        dict(part="resnet18", error="RuntimeError: CUDA error: an illegal memory access was "
                                    "encountered"),
        dict(part="profile", error="MemoryError: out of memory in the profiled step")]
    assert final["profile"] is None


def test_the_result_says_what_data_was_measured(saved):
    data = saved[0]["bench"]["data"]
    assert data["kind"] == "synthetic" and data["shaped_as"] == "CIFAR-100"
    assert data["images"] == kit.QUICK["synthetic_size"]
    assert data["classes"] == kit.QUICK["num_classes"] and data["channels"] == 3
    assert data["image_size"] == {"wrn": 32, "resnet18": 16}
