"""Your own data and models, one process on the CPU: torchvision models by name, local
weights, progress lines, config files, data preparation and staging of a tar'd folder."""

from __future__ import annotations

import json

import pytest

from tests.helpers import TINY, read_jsonl, run_train, tar_folder, write_image_folder

SYNTHETIC = ["--dataset", "synthetic", "--synthetic-size", "64", "--num-classes", "4",
             "--batch-size", "8", "--image-size", "32"]


def usage_error(args: list[str], capsys) -> str:
    from workload.train import main

    with pytest.raises(SystemExit) as stop:
        main(args)
    assert stop.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize("model", ["mobilenet_v3_small", "shufflenet_v2_x0_5"])
@pytest.mark.slow
def test_torchvision_models_train_by_name(model, tmp_path):
    summary = run_train(["--model", model, "--device", "cpu", *SYNTHETIC, "--max-steps", "2"],
                        tmp_path / "run")
    assert summary["model"] == model and summary["steps_run"] == 2
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["stem"] == "imagenet"  # their own: only ResNets have a small-image stem


def test_a_wrong_model_name_exits_2_with_suggestions(tmp_path, capsys):
    err = usage_error(["--model", "resnet_50", "--output-dir", str(tmp_path / "x")], capsys)
    assert "--model 'resnet_50'" in err and "did you mean resnet50" in err
    assert not (tmp_path / "x").exists()


@pytest.mark.slow
def test_resnet_stem_is_printed_and_recorded(tmp_path, capsys):
    run_train(["--model", "resnet18", "--device", "cpu", *SYNTHETIC, "--max-steps", "1"],
              tmp_path / "run")
    assert "stem small (3x3 stride-1 convolution" in capsys.readouterr().out
    assert json.loads((tmp_path / "run" / "config.json").read_text())["stem"] == "small"


@pytest.mark.slow
def test_init_from_a_runs_weights_and_a_refused_head(tmp_path, capsys):
    first = run_train([*TINY, *SYNTHETIC, "--max-steps", "2"], tmp_path / "a")
    weights = tmp_path / "a" / "model.safetensors"
    from workload.models import build_model
    from workload.models import load_initial_weights
    from workload.records import model_sha256

    fresh = build_model("wrn", 4, width=8, blocks_per_stage=1)
    load_initial_weights(fresh, str(weights))
    assert model_sha256(fresh) == first["model_sha256"]  # the same weights, the same evaluation
    run_train([*TINY, *SYNTHETIC, "--max-steps", "1", "--init-from", str(weights)],
              tmp_path / "b")
    assert f"initialised from {weights}" in capsys.readouterr().out
    other = [*TINY, *SYNTHETIC, "--num-classes", "3", "--max-steps", "1",
             "--init-from", str(weights)]
    err = usage_error([*other, "--output-dir", str(tmp_path / "c")], capsys)
    assert "tensor 'fc.weight' is [4, 32] in the file but [3, 32]" in err
    assert len(err.strip().splitlines()) == 1
    run_train([*other, "--init-reinit-head"], tmp_path / "d")
    assert "head fc.bias, fc.weight started afresh" in capsys.readouterr().out


@pytest.mark.slow
def test_log_every_prints_progress_inside_the_epoch(tmp_path, capsys):
    run_train([*TINY, *SYNTHETIC, "--synthetic-size", "256", "--epochs", "1",
               "--log-every", "10"], tmp_path / "run")
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if line.startswith("train: step ")]
    assert [line.split()[2] for line in lines] == ["10/32", "20/32", "30/32"]
    assert all("img/s, ETA" in line for line in lines)
    assert out.index("step 30/32") < out.index("epoch 1/1")
    records = read_jsonl(tmp_path / "run" / "steps.jsonl")
    assert [r["step"] for r in records] == [10, 20, 30]
    assert {"loss", "images_per_second", "eta_s", "peak_memory_gib"} <= records[0].keys()


@pytest.mark.slow
def test_config_file_starts_the_same_run_again(tmp_path, capsys):
    first = run_train([*TINY, *SYNTHETIC, "--max-steps", "3", "--seed", "3",
                       "--resume", "never", "--overwrite"], tmp_path / "a")
    again = run_train(["--config", str(tmp_path / "a" / "config.json")], tmp_path / "b")
    assert again["model_sha256"] == first["model_sha256"]
    other = run_train(["--config", str(tmp_path / "a" / "config.json"), "--seed", "4"],
                      tmp_path / "c")
    assert other["model_sha256"] != first["model_sha256"]  # a flag overrides the file
    configs = [json.loads((tmp_path / d / "config.json").read_text()) for d in "abc"]
    assert configs[1] == dict(configs[0], output_dir=str(tmp_path / "b"))
    assert configs[2]["seed"] == 4
    # Run again into B: it resumes B; A's --resume never --overwrite are not repeated.
    capsys.readouterr()
    run_train(["--config", str(tmp_path / "a" / "config.json"), "--max-steps", "4"],
              tmp_path / "b")
    assert (tmp_path / "b" / "checkpoints" / "step-000000003").is_dir()
    said = capsys.readouterr()
    assert "resumed from" in said.out + said.err


@pytest.mark.slow
def test_prepare_data_then_train_from_a_staged_tar(tmp_path, capsys):
    tar = tar_folder(write_image_folder(tmp_path / "pets", per_class=4), tmp_path / "pets.tar")
    data = ["--dataset", "imagefolder", "--data-dir", str(tar), "--stage-to",
            str(tmp_path / "local"), "--image-size", "16", "--workers", "0"]
    from workload.train import main

    main([*data, "--prepare-data", "--output-dir", str(tmp_path / "unused")])
    out = capsys.readouterr().out
    assert "staged" in out and "data ready: imagefolder" in out and "8 training images" in out
    assert not (tmp_path / "unused").exists()
    summary = run_train([*TINY, *data, "--batch-size", "4", "--epochs", "1"], tmp_path / "run")
    assert "reusing the staging" in capsys.readouterr().out
    assert summary["steps_run"] == 2


@pytest.mark.slow
def test_wandb_logs_the_epoch_metrics_offline(tmp_path, monkeypatch):
    # No internet on compute nodes: offline by default, into <output-dir>/wandb/wandb/ (W&B
    # makes its own wandb/ inside the private folder train holds for it) for a later
    # `wandb sync`, the path docs/your-data.md gives. The run file is wandb's own record
    # format; the tags it logged appear in it as text.
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("WANDB_SILENT", "true")
    out = tmp_path / "run"
    run_train([*TINY, *SYNTHETIC, "--epochs", "2", "--wandb"], out)
    runs = list((out / "wandb" / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(runs) == 1
    logged = runs[0].read_bytes()
    for tag in (b"loss/train", b"loss/test", b"accuracy/test", b"throughput/images_per_second"):
        assert tag in logged
