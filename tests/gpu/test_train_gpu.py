"""`train` on a GPU with its GPU defaults: bf16 autocast, channels-last, the fused SGD
step, the `device` data backend; --compile; a CUDA run's checkpoint and exact resume;
`evaluate` and `predict` of the trained model on the GPU."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import CHECKPOINT_ARGS, TESTS, TINY, clean_env, run_train, write_image_folder

pytestmark = pytest.mark.gpu

ON_GPU = ["--device", "cuda"]  # after TINY's --device cpu: the last one counts
DETERMINISTIC = TESTS / "scripts" / "deterministic_train.py"


def recipe_flags(dataset: str) -> list[str]:
    """The CPU recipe's tuned values as flags (recipes apply to the CPU only)."""
    from workload.config import RECIPES

    recipe = RECIPES[(dataset, "cpu")]
    return [part for key, value in recipe.items() if key != "name"
            for part in (f"--{key.replace('_', '-')}", str(value))]


@pytest.fixture(scope="module")
def digits_run(tmp_path_factory) -> Path:
    """The digits recipe trained on the GPU with train's GPU defaults (module-scoped: the
    evaluate and predict tests reuse it; skipped with the tests where CUDA is absent)."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("CUDA is absent (torch.cuda.is_available() is False)")
    out = tmp_path_factory.mktemp("digits") / "run"
    run_train(["--dataset", "digits", *recipe_flags("digits"), *ON_GPU, "--seed", "0"], out)
    return out


def test_digits_recipe_trains_to_its_accuracy_with_the_gpu_defaults(cuda, digits_run):
    summary = json.loads((digits_run / "summary.json").read_text())
    config = json.loads((digits_run / "config.json").read_text())
    assert summary["device"].startswith("cuda") and summary["precision"] == "bf16"
    assert config["channels_last"] is True and config["data_backend"] in ("auto", "device")
    assert summary["final_accuracy"] >= 0.90, summary  # the recipe's promise (README)
    # benchmark mode is off by default (the H200's figures): nothing is autotuned.
    assert summary["startup"]["phases_s"]["cudnn autotune"] < 0.01, summary["startup"]
    # CUDA's context started in its own thread while train imported, before the model.
    context, phases = summary["startup"]["cuda_context_s"], summary["startup"]["phases_s"]
    assert 0 < context["started"] < phases["imports"], summary["startup"]
    assert context["ready"] > context["started"], summary["startup"]


def test_the_gpu_build_uses_bf16_channels_last_and_the_fused_sgd_step(cuda):
    import torch

    from workload import distributed
    from workload.config import build_config
    from workload.precision import resolve_precision
    from workload.training.build import build_state

    info = distributed.init_distributed("cuda", 600, None)
    cfg = build_config({"model": "wrn", "width": 8, "blocks_per_stage": 1, "device": "cuda",
                        "dataset": "synthetic"}, "cuda")
    precision = resolve_precision(cfg.hardware.precision, cuda)
    state = build_state(cfg, info, num_classes=10, steps_per_epoch=4, precision=precision)
    assert precision == "bf16" and state.optimizer.defaults["fused"] is True
    conv = next(m for m in state.model.modules() if isinstance(m, torch.nn.Conv2d))
    assert conv.weight.is_contiguous(memory_format=torch.channels_last)


@pytest.mark.timeout(420)  # Inductor's first compile; under the GPU check's 450 s part
def test_compile_trains_and_reports_the_compile_time(cuda, tmp_path):
    summary = run_train([*TINY, *ON_GPU, "--dataset", "synthetic", "--synthetic-size", "256",
                         "--num-classes", "4", "--batch-size", "32", "--epochs", "1",
                         "--compile"], tmp_path / "run")
    assert summary["steps_run"] == 8 and summary["first_step_s"] > 0
    assert summary["precision"] == "bf16" and summary["device"].startswith("cuda")


def deterministic_train(args: list[str], out: Path) -> dict:
    """`train` in its own process with CUDA's deterministic settings (see the helper)."""
    done = subprocess.run([sys.executable, str(DETERMINISTIC), *args, "--output-dir", str(out)],
                          capture_output=True, text=True, env=clean_env(), timeout=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads((out / "summary.json").read_text())


@pytest.mark.timeout(420)  # compiled: two jobs, each with Inductor's compile
@pytest.mark.parametrize("compiled", [
    [], ["--compile", "--compile-scope", "blocks"],
    ["--compile", "--compile-mode", "reduce-overhead"],
    ["--compile", "--compile-scope", "step"],
    ["--compile", "--compile-scope", "step", "--compile-mode", "reduce-overhead"]],
    ids=["eager", "compiled-blocks", "cudagraphs", "compile-step", "cudagraphs-step"])
def test_a_cuda_run_resumes_exactly_from_a_mid_epoch_checkpoint(cuda, tmp_path, compiled):
    # Exact on a GPU needs what tests/scripts/deterministic_train.py sets: cuDNN without
    # benchmark mode and with deterministic algorithms, torch's deterministic algorithms,
    # CUBLAS_WORKSPACE_CONFIG=:4096:8. The checkpoint carries the rest (RNG states).
    # Compiled per block (Inductor's fused BatchNorm, ReLU and add) it must stay exact,
    # under CUDA graphs (the fastest row on the H200, which train takes as its default
    # only once this passes there: bench's RESUME_TESTED), and with the whole step in the
    # graph, the optimizer step compiled (its learning rate a tensor), eager-launched or
    # in CUDA graphs.
    args = [*CHECKPOINT_ARGS, *ON_GPU, "--checkpoint-every", "1", "--keep-checkpoints", "100",
            *compiled]
    whole = deterministic_train(args, tmp_path / "whole")
    step3 = tmp_path / "whole" / "checkpoints" / f"step-{3:09d}"
    assert step3.is_dir()
    resumed = deterministic_train([*args, "--resume", str(step3)], tmp_path / "resumed")
    assert resumed["steps_run"] == whole["steps_run"] == 16
    assert resumed["model_sha256"] == whole["model_sha256"]


def test_evaluate_on_the_gpu_gives_the_runs_accuracy(cuda, digits_run, tmp_path):
    summary = json.loads((digits_run / "summary.json").read_text())
    out = tmp_path / "evaluate.json"
    done = subprocess.run(["evaluate", str(digits_run), "--dataset", "digits", *ON_GPU,
                           "--json", str(out)], capture_output=True, text=True,
                          env=clean_env(), timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["accuracy"] == pytest.approx(summary["final_accuracy"], abs=0.01), result


def test_predict_on_the_gpu_names_a_class_per_image(cuda, digits_run, tmp_path):
    images = write_image_folder(tmp_path / "images", classes=2, per_class=3, size=32)
    done = subprocess.run(["predict", str(digits_run), str(images), *ON_GPU, "--top-k", "3"],
                          capture_output=True, text=True, env=clean_env(), timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    assert len(lines) == 12  # train/ and val/, 2 classes of 3 each
    assert all(len(line["top"]) == 3 for line in lines), lines[:1]
