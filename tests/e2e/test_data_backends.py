"""`--data-backend`: the automatic choice and its printed reason, every backend training,
and bad requests refused before any work."""

import pytest
import torch

from tests.helpers import TINY, run_train, write_image_folder
from workload.data.backends import available, choose
from workload.errors import UsageError

SYNTHETIC = ["--dataset", "synthetic", "--synthetic-size", "256", "--num-classes", "4",
             "--batch-size", "32", "--epochs", "1"]
CPU, GPU = torch.device("cpu"), torch.device("cuda", 0)


def test_dali_is_registered_when_it_imports():
    assert {"device", "torch", "dali"} <= available().keys()


@pytest.mark.parametrize("dataset, device, backend, why", [
    ("cifar100", CPU, "device", "fits in memory"),
    ("digits", GPU, "device", "fits in memory"),
    ("imagefolder", CPU, "torch", "no GPU"),
    ("imagefolder", GPU, "dali", "on the GPU by NVIDIA DALI"),
])
def test_auto_choice_and_its_reason(dataset, device, backend, why):
    chosen, reason = choose("auto", dataset, device)
    assert chosen == backend and why in reason


@pytest.mark.parametrize("backend", ["device", "torch", "dali"])
def test_every_backend_trains_and_says_so(backend, tmp_path, capsys):
    summary = run_train([*TINY, *SYNTHETIC, "--data-backend", backend], tmp_path / "run")
    assert summary["steps_run"] == 256 // 32 and summary["final_accuracy"] is not None
    assert f"data backend {backend}:" in capsys.readouterr().out


def test_dali_trains_the_same_model_as_the_device_backend_on_the_cpu(tmp_path):
    # Same shard order, same per-batch flips and offsets: bit-identical weights.
    args = [*TINY, *SYNTHETIC, "--max-steps", "4", "--seed", "3"]
    device = run_train([*args, "--data-backend", "device"], tmp_path / "device")
    dali = run_train([*args, "--data-backend", "dali"], tmp_path / "dali")
    assert device["model_sha256"] == dali["model_sha256"]


def test_device_backend_cannot_read_image_folders():
    with pytest.raises(UsageError, match="--data-backend device needs an in-memory dataset"):
        choose("device", "imagefolder", CPU)


def test_unknown_backend_exits_2(tmp_path, capsys):
    with pytest.raises(SystemExit) as stop:
        run_train([*TINY, *SYNTHETIC, "--data-backend", "fast"], tmp_path / "run")
    assert stop.value.code == 2 and "--data-backend" in capsys.readouterr().err


@pytest.mark.parametrize("backend", ["dali", "torch"])
def test_image_folders_are_decoded_by_dali_and_by_torch(backend, tmp_path, capsys):
    write_image_folder(tmp_path / "images")
    summary = run_train([*TINY, "--dataset", "imagefolder", "--data-dir", str(tmp_path / "images"),
                         "--image-size", "32", "--batch-size", "4", "--epochs", "1",
                         "--data-backend", backend], tmp_path / "run")
    assert summary["steps_run"] == 16 // 4 and summary["final_accuracy"] is not None
    assert f"data backend {backend}:" in capsys.readouterr().out
