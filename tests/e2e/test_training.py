"""Real training runs on the CPU: convergence, determinism, precision, what a run writes."""

import json

import pytest
import torch

from tests.helpers import TINY, read_jsonl, run_train

pytestmark = pytest.mark.slow  # every test here trains

SUMMARY_KEYS = {
    "final_accuracy", "best_accuracy", "epochs_run", "steps_run", "images_per_second",
    "total_time_s", "world_size", "device", "precision", "model_sha256", "versions",
}
SYNTHETIC = ["--dataset", "synthetic", "--synthetic-size", "256", "--num-classes", "4",
             "--batch-size", "32"]


def test_quick_start_recipe_reaches_90_percent_on_digits(tmp_path, capsys):
    # Exactly the README's quick start: no flag but the dataset and the device.
    summary = run_train(["--dataset", "digits", "--device", "cpu"], tmp_path / "run")
    assert "recipe digits-cpu" in capsys.readouterr().out
    assert summary["final_accuracy"] >= 0.90
    assert summary["steps_run"] <= 10 * (1438 // 64)  # bounded: the recipe's 10 epochs


def test_same_seed_same_parameters_and_metrics(tmp_path):
    args = [*TINY, *SYNTHETIC, "--epochs", "2", "--seed", "7"]
    first = run_train(args, tmp_path / "a")
    second = run_train(args, tmp_path / "b")
    assert first["model_sha256"] == second["model_sha256"]
    strip = lambda rows: [{k: v for k, v in r.items() if "time" not in k and "second" not in k}
                          for r in rows]
    assert strip(read_jsonl(tmp_path / "a" / "metrics.jsonl")) == \
        strip(read_jsonl(tmp_path / "b" / "metrics.jsonl"))
    other = run_train([*TINY, *SYNTHETIC, "--epochs", "2", "--seed", "8"], tmp_path / "c")
    assert other["model_sha256"] != first["model_sha256"]


def test_run_writes_config_metrics_and_summary(tmp_path):
    out = tmp_path / "run"
    summary = run_train([*TINY, *SYNTHETIC, "--epochs", "2"], out)
    assert SUMMARY_KEYS <= summary.keys()
    assert summary["epochs_run"] == 2 and summary["steps_run"] == 2 * (256 // 32)
    assert summary["world_size"] == 1 and summary["device"] == "cpu"
    assert summary["images_per_second"] > 0 and len(summary["model_sha256"]) == 64
    assert {"torch", "torchvision"} <= summary["versions"].keys()
    config = json.loads((out / "config.json").read_text())
    assert config["batch_size"] == 32 and config["dataset"] == "synthetic"
    records = read_jsonl(out / "metrics.jsonl")
    assert [r["epoch"] for r in records] == [1, 2]
    for record in records:
        assert {"train_loss", "accuracy", "epoch_time_s", "images_per_second"} <= record.keys()


def test_max_steps_stops_a_smoke_run_mid_epoch(tmp_path):
    summary = run_train([*TINY, *SYNTHETIC, "--max-steps", "3"], tmp_path / "run")
    assert summary["steps_run"] == 3 and summary["epochs_run"] == 1
    assert summary["final_accuracy"] is not None


def test_early_stopping_uses_the_references_rule(tmp_path):
    # Any accuracy reaches a target of 0.001: two epochs at it (patience 2), then stop.
    summary = run_train([*TINY, *SYNTHETIC, "--epochs", "10", "--target-accuracy", "0.001",
                         "--patience", "2"], tmp_path / "run")
    assert summary["epochs_run"] == 2 and summary["stopped_early"] is True


@pytest.mark.parametrize("precision", ["bf16", "fp16", "tf32"])
def test_precisions_train_on_the_cpu(precision, tmp_path):
    summary = run_train([*TINY, *SYNTHETIC, "--max-steps", "2", "--precision", precision,
                         "--channels-last"], tmp_path / "run")
    assert summary["precision"] == precision and summary["steps_run"] == 2


def tf32_switches() -> tuple[bool, bool]:
    return torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32


def test_tf32_switches_are_set_both_ways_for_the_run_and_put_back(tmp_path, monkeypatch):
    from workload.training.trainer import Trainer

    seen, fit = [], Trainer.fit

    def recording_fit(self):  # the switches as the training loop runs with them
        seen.append(tf32_switches())
        return fit(self)

    monkeypatch.setattr(Trainer, "fit", recording_fit)
    before = tf32_switches()
    run_train([*TINY, *SYNTHETIC, "--max-steps", "1", "--precision", "tf32"], tmp_path / "a")
    run_train([*TINY, *SYNTHETIC, "--max-steps", "1", "--precision", "fp32"], tmp_path / "b")
    assert seen == [(True, True), (False, False)]
    assert tf32_switches() == before  # a program that called train keeps its own


def test_label_smoothing_and_resnet18_train(tmp_path):
    summary = run_train(["--model", "resnet18", "--device", "cpu", *SYNTHETIC, "--batch-size",
                         "8", "--max-steps", "2", "--label-smoothing", "0.1"], tmp_path / "run")
    assert summary["model"] == "resnet18" and summary["steps_run"] == 2

