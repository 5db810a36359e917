"""The config table: every flag reaches its typed field, recipes fill only what was left
out, validation names the flag and the fix. No torch: these run in milliseconds."""

from __future__ import annotations

import argparse
import importlib.util

import pytest

from workload.config import (Every, TrainConfig, add_flags, build_config, flag_of, given)
from workload.config import FIELDS, KEYS
from workload.errors import UsageError


def parse(argv: list[str]) -> dict:
    parser = argparse.ArgumentParser()
    add_flags(parser)
    return given(parser.parse_args(argv))


@pytest.mark.parametrize("argv, section, field, value", [
    (["--model", "resnet18"], "model", "name", "resnet18"),
    (["--width", "32"], "model", "width", 32),
    (["--dropout", "0.1"], "model", "dropout", 0.1),
    (["--dataset", "digits"], "data", "dataset", "digits"),
    (["--data-dir", "/scratch/d"], "data", "data_dir", "/scratch/d"),
    (["--download"], "data", "download", True),
    (["--workers", "3"], "data", "workers", 3),
    (["--data-backend", "torch"], "data", "data_backend", "torch"),
    (["--batch-size", "64"], "training", "batch_size", 64),
    (["--base-lr", "0.1"], "training", "base_lr", 0.1),
    (["--max-steps", "5"], "training", "max_steps", 5),
    (["--seed", "7"], "training", "seed", 7),
    (["--precision", "bf16"], "hardware", "precision", "bf16"),
    (["--channels-last"], "hardware", "channels_last", True),
    (["--no-channels-last"], "hardware", "channels_last", False),
    (["--compile"], "hardware", "compile", True),
    (["--compile", "--compile-scope", "blocks"], "hardware", "compile_scope", "blocks"),
    (["--cudnn-benchmark"], "hardware", "cudnn_benchmark", True),
    (["--strategy", "fsdp"], "distributed", "strategy", "fsdp"),
    (["--dist-timeout", "30"], "distributed", "dist_timeout_s", 30.0),
    (["--dist-start-timeout", "900"], "distributed", "dist_start_timeout_s", 900.0),
    (["--stall-timeout", "0"], "distributed", "stall_timeout_s", 0.0),
    (["--resume", "never"], "checkpoint", "resume", "never"),
    (["--checkpoint-every", "500"], "checkpoint", "checkpoint_every", Every(500, 0.0)),
    (["--checkpoint-every", "10m"], "checkpoint", "checkpoint_every", Every(0, 600.0)),
    (["--keep-checkpoints", "5"], "checkpoint", "keep_checkpoints", 5),
    (["--preempt-signal", "TERM"], "checkpoint", "preempt_signal", "TERM"),
    (["--output-dir", "runs/x"], "logging", "output_dir", "runs/x"),
])
def test_each_flag_reaches_its_typed_field(argv, section, field, value):
    cfg = build_config(parse(argv), "cpu")
    assert getattr(getattr(cfg, section), field) == value


def test_every_field_has_a_flag_with_help():
    parser = argparse.ArgumentParser()
    add_flags(parser)
    text = parser.format_help()
    for key, f in FIELDS.items():
        assert flag_of(key) in text
        assert f.metadata["help"]


def test_flags_left_out_are_not_given():
    assert all(value is None for value in parse([]).values())


def test_defaults_are_the_reference_settings():
    flat = build_config({}, "cpu").to_dict()
    assert (flat["model"], flat["batch_size"], flat["epochs"], flat["base_lr"],
            flat["target_accuracy"], flat["patience"]) == ("wrn", 256, 100, 0.01, 0.95, 2)
    assert flat["checkpoint_every"] == "30m"


def test_recipe_fills_only_what_was_left_out():
    cfg = build_config({"dataset": "digits", "batch_size": 32}, "cpu")
    assert cfg.recipe == "digits-cpu"
    assert cfg.training.batch_size == 32          # given: kept
    assert cfg.model.width == 16                  # left out: the recipe's
    assert build_config({"dataset": "digits"}, "cuda").recipe == ""


def test_device_defaults_fill_only_what_was_left_out():
    assert build_config({}, "cuda").hardware.channels_last is True
    assert build_config({"channels_last": False}, "cuda").hardware.channels_last is False
    assert build_config({}, "cpu").hardware.channels_last is False


def test_flat_form_round_trips():
    cfg = build_config(parse(["--checkpoint-every", "90s", "--model", "resnet50"]), "cpu")
    again = TrainConfig.from_flat(cfg.to_dict())
    assert again == cfg
    assert list(cfg.to_dict())[:-1] == list(KEYS)  # config.json keys: the flags' names


def test_unknown_keys_are_refused():
    with pytest.raises(KeyError, match="batchsize"):
        TrainConfig.from_flat({"batchsize": 3})


@pytest.mark.parametrize("text, steps, seconds, again", [
    ("500", 500, 0.0, "500"), ("10m", 0, 600.0, "10m"), ("90s", 0, 90.0, "90s"),
    ("1h", 0, 3600.0, "1h"), ("0", 0, 0.0, "0"), ("3600s", 0, 3600.0, "1h"),
])
def test_every_reads_steps_or_durations_and_writes_them_back(text, steps, seconds, again):
    every = Every.parse(text)
    assert (every.steps, every.seconds, str(every)) == (steps, seconds, again)


@pytest.mark.parametrize("values, words", [
    ({"batch_size": 0}, ["--batch-size", "1 or more", "--batch-size 256"]),
    ({"keep_checkpoints": 0}, ["--keep-checkpoints", "1 or more"]),
    ({"base_lr": 0.0}, ["--base-lr", "greater than 0"]),
    ({"momentum": 1.0}, ["--momentum", "less than 1.0"]),
    ({"target_accuracy": 95}, ["--target-accuracy", "at most 1.0", "0.95 for 95 %"]),
    ({"image_size": 4}, ["--image-size 4", "8 or more"]),
    ({"dist_timeout_s": 0}, ["--dist-timeout", "greater than 0"]),
    ({"stall_timeout_s": -5}, ["--stall-timeout", "from 0.0 to", "600"]),
    ({"model": " "}, ["--model", "--model wrn"]),
    ({"model": "wrn", "stem": "imagenet"}, ["--stem imagenet", "leave out --stem"]),
    ({"model": "efficientnet_b0", "stem": "small"}, ["--stem small", "resnet*"]),
    ({"init_reinit_head": True}, ["--init-reinit-head", "--init-from"]),
    ({"init_from": "/nonexistent.safetensors"},
     ["--init-from /nonexistent.safetensors does not exist", "path of a .safetensors file"]),
    ({"init_from": "/tmp"}, ["--init-from /tmp is not a .safetensors file", "convert"]),
    ({"log_every": -1}, ["--log-every", "0"]),
    ({"data_dir": "x.tar"}, ["tar file", "--stage-to"]),
    ({"stage_to": "/tmp", "dataset": "digits"}, ["--stage-to", "digits"]),
    ({"resume": "/nonexistent/step-1"}, ["--resume /nonexistent/step-1", "auto"]),
    ({"overwrite": True}, ["--overwrite", "--resume never"]),
    ({"compile_scope": "blocks"}, ["--compile-scope blocks", "add --compile"]),
    ({"compile_mode": "reduce-overhead"}, ["--compile-mode reduce-overhead", "--compile"]),
    ({"compile": True, "compile_scope": "blocks", "model": "vit_b_16"},
     ["--compile-scope blocks", "--model vit_b_16", "--compile-scope model"]),
    ({"cudnn_benchmark_limit": -1}, ["--cudnn-benchmark-limit", "0"]),
])
def test_bad_values_name_the_flag_and_the_fix(values, words):
    with pytest.raises(UsageError) as error:
        build_config(values)
    for word in words:
        assert word in str(error.value)


def test_bad_checkpoint_every_is_a_usage_error():
    with pytest.raises(UsageError, match="--checkpoint-every 'soon'.*10m"):
        Every.parse("soon")


def test_unsafe_torch_load_variable_is_refused(monkeypatch):
    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
    with pytest.raises(UsageError, match="unset it"):
        build_config({})


def test_config_file_values_and_their_checks(tmp_path):
    import json

    from workload.config import read_config_file

    good = tmp_path / "run.json"
    good.write_text(json.dumps(dict(TrainConfig().to_dict(), batch_size=64,
                                    checkpoint_every="10m", recipe="")))
    values = read_config_file(str(good))
    assert values["batch_size"] == 64 and "recipe" not in values
    assert build_config(values).checkpoint.checkpoint_every == Every(0, 600.0)
    toml = tmp_path / "run.toml"
    toml.write_text('model = "resnet18"\nbase_lr = 1\n')
    assert read_config_file(str(toml)) == dict(model="resnet18", base_lr=1)
    for text, words in [('{"batchsize": 3}', "did you mean batch_size"),
                        ('{"epochs": "ten"}', "epochs must be an integer, got 'ten'"),
                        ('{"epochs": true}', "epochs must be an integer"),
                        ('[1]', "one object of settings"), ('{"epochs": ', "not valid JSON")]:
        bad = tmp_path / "bad.json"
        bad.write_text(text)
        with pytest.raises(UsageError, match=words):
            read_config_file(str(bad))
    with pytest.raises(UsageError, match="--config /nonexistent.json"):
        read_config_file("/nonexistent.json")


@pytest.mark.parametrize("flag, package", [("wandb", "wandb"), ("tensorboard", "tensorboard")])
def test_a_missing_optional_package_is_a_usage_error(flag, package, monkeypatch):
    # The test environment has both packages: hide one, as on a machine without the extra.
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == package else real(name, *a))
    with pytest.raises(UsageError, match=rf"--{flag} needs the {package} package.*"
                                         rf"pip install [a-z ]*{package}"):
        build_config({flag: True})


@pytest.mark.parametrize("argv, words", [
    (["--base-lr", "inf"], ["--base-lr", "finite", "inf"]),
    (["--base-lr", "nan"], ["--base-lr", "finite"]),
    (["--weight-decay", "inf"], ["--weight-decay", "finite"]),
    (["--warmup-epochs", "inf"], ["--warmup-epochs", "finite"]),
    (["--dist-timeout", "inf"], ["--dist-timeout", "finite"]),
    (["--base-lr", "1e308"], ["--base-lr", "at most 1000", "--base-lr 0.01"]),
    (["--seed", "12345678901234567890"], ["--seed", "from 0 to 4294967295"]),
    (["--seed", "-1"], ["--seed", "from 0 to 4294967295", "-1"]),
    (["--dist-timeout", "1e12"], ["--dist-timeout", "at most"]),
    # models too large for any memory: the fields' bounds, which model.json is held to too
    (["--width", "100000"], ["--width", "from 1 to 1024", "--width 160"]),
    (["--blocks-per-stage", "100000"], ["--blocks-per-stage", "from 1 to 100"]),
    (["--image-size", "40000"], ["--image-size", "to 2048"]),
    (["--dropout", "1.0"], ["--dropout", "from 0.0 to 0.99"]),
    (["--num-classes", "1000000000"], ["--num-classes", "to 100000"]),
])
def test_non_finite_and_absurd_values_are_usage_errors(argv, words):
    with pytest.raises(UsageError) as error:
        build_config(parse(argv), "cpu")
    for word in words:
        assert word in str(error.value)



def test_every_boolean_flag_can_be_turned_off_over_a_config_file(tmp_path):
    import json

    from workload.config import read_config_file

    booleans = [key for key, f in FIELDS.items() if f.type is bool]
    assert {"compile", "tensorboard", "wandb", "download", "channels_last"} <= set(booleans)
    recorded = tmp_path / "config.json"
    recorded.write_text(json.dumps({key: True for key in booleans
                                    if not FIELDS[key].metadata["one_shot"]}))
    off = parse([f"--no-{key.replace('_', '-')}" for key in booleans])
    assert off == {**{k: None for k in KEYS}, **{k: False for k in booleans}}
    values = {**read_config_file(str(recorded)), **{k: v for k, v in off.items() if v is not None}}
    cfg = build_config(values, "cpu")
    assert not any(getattr(getattr(cfg, s), n) for s, n in (KEYS[k] for k in booleans))


def test_one_shot_actions_are_not_recorded_and_not_repeated(tmp_path, capsys):
    """`train --config A/config.json --output-dir B` (run it again) must not inherit A's
    --overwrite --resume never (which would delete B's checkpoints) nor its downloads."""
    import json

    from workload.config import read_config_file, repeatable
    from workload.config import ONE_SHOT

    assert set(ONE_SHOT) == {"overwrite", "resume", "download", "prepare_data", "shards",
                             "shard_size"}
    cfg = build_config(dict(overwrite=True, resume="never", download=True), "cpu")
    assert not set(ONE_SHOT) & set(cfg.recorded())
    old = tmp_path / "config.json"  # as written before: one-shot actions in it
    old.write_text(json.dumps(dict(cfg.to_dict(), batch_size=64)))
    kept, ignored = repeatable(read_config_file(str(old)))
    assert kept["batch_size"] == 64 and not set(ONE_SHOT) & set(kept)
    assert ignored == ["download", "overwrite", "resume"]  # prepare_data was its default


@pytest.mark.parametrize("name, text", [
    ("deep.json", "[" * 100_000), ("deep.toml", "a = " + "[" * 100_000),
    ("latin1.json", b'{"data_dir": "/d\xe9"}'),
])
def test_a_hostile_config_file_is_one_usage_error(tmp_path, name, text):
    from workload.config import read_config_file

    path = tmp_path / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(UsageError, match=f"--config {path}"):
        read_config_file(str(path))
