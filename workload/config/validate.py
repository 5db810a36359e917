"""Validation of a TrainConfig: the first bad value raises UsageError naming the flag, what
was expected and the fix. Standard library only, so every usage error is found before
torch is imported."""

from __future__ import annotations

import importlib.util
import math
import os
from pathlib import Path

from workload.config.derived import resolve_stem
from workload.config.schema import (FIELDS, KEYS, MIN_IMAGE_SIZE, example_of, flag_of,
                                    out_of_bounds)
from workload.errors import UsageError

# torch.load ignores weights_only=True when this variable is set.
UNSAFE_LOAD_ENV = "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"


def validate(cfg: TrainConfig) -> TrainConfig:
    flat = cfg.to_dict()
    for check in (_check_choices, _check_numbers, _check_special_values, _check_checkpoint,
                  _check_optional_packages, _check_model, _check_data_files):
        check(flat)
    resolve_stem(cfg)  # a forced stem the model lacks
    _check_unsafe_load_env(os.environ)
    return cfg


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise UsageError(message)


def _check_choices(c: dict) -> None:
    for key in KEYS:
        allowed = FIELDS[key].metadata["choices"]
        _require(not allowed or c[key] in allowed,
                 f"{flag_of(key)} {c[key]!r} is not known; choose one of {', '.join(allowed)}")


def _check_numbers(c: dict) -> None:
    """Every number finite (`inf` and `nan` pass some ranges, then train to NaN deep
    inside torch) and within its field's Range (schema.py), with an example to pass."""
    for key in KEYS:
        value, flag = c[key], flag_of(key)
        if isinstance(value, float):
            _require(math.isfinite(value), f"{flag} must be a finite number, got {value!r}")
        problem = out_of_bounds(key, value) if isinstance(value, (int, float)) else ""
        _require(not problem, f"{flag} {problem}; pass e.g. {flag} {example_of(key)}")


def _check_special_values(c: dict) -> None:
    """The rules a Range cannot say: an image side of 0 (the dataset's own) or one the
    models' pooling takes; a run folder's name."""
    _require(c["image_size"] == 0 or c["image_size"] >= MIN_IMAGE_SIZE,
             f"--image-size {c['image_size']} is too small for the models' pooling; use "
             f"{MIN_IMAGE_SIZE} or more")
    _require(bool(c["output_dir"]), "--output-dir must not be empty")


def _check_checkpoint(c: dict) -> None:
    resume = c["resume"]
    _require(resume in ("auto", "never") or Path(resume).is_dir(),
             f"--resume {resume} is not a checkpoint directory; pass auto, never, or a "
             "folder such as <output-dir>/checkpoints/step-000000120")
    _require(not c["overwrite"] or resume == "never",
             "--overwrite replaces the checkpoints in the output directory and only goes "
             f"with --resume never (got --resume {resume})")


def _check_optional_packages(c: dict) -> None:
    _require(not c["tensorboard"] or importlib.util.find_spec("tensorboard") is not None,
             "--tensorboard needs the tensorboard package, which is not installed; "
             "pip install matplotlib tensorboard (the report extra) or leave out "
             "--tensorboard")
    _require(not c["wandb"] or importlib.util.find_spec("wandb") is not None,
             "--wandb needs the wandb package, which is not installed; "
             "pip install wandb or leave out --wandb")


def _check_model(c: dict) -> None:
    # The name itself is checked against torchvision's registry once torch is imported.
    _require(bool(c["model"].strip()), "--model must not be empty; pass e.g. --model wrn")
    init = c["init_from"]
    _require(not init or (init.endswith(".safetensors") and Path(init).is_file()),
             f"--init-from {init} is not a .safetensors file; convert the weights first "
             "(see docs/your-data.md, 'Starting from published weights')")
    _require(not c["init_reinit_head"] or bool(init),
             "--init-reinit-head only goes with --init-from FILE.safetensors")


TAR_SUFFIXES = (".tar", ".tar.gz", ".tgz")


def _check_data_files(c: dict) -> None:
    data_dir, stage_to = c["data_dir"], c["stage_to"]
    is_tar = data_dir.endswith(TAR_SUFFIXES)
    _require(not is_tar or bool(stage_to),
             f"--data-dir {data_dir} is a tar file: add --stage-to DIR (e.g. $SLURM_TMPDIR) "
             "to unpack it on each node, or unpack it yourself")
    if not stage_to:
        return
    _require(c["dataset"] in ("cifar100", "imagefolder"),
             f"--stage-to copies --data-dir, which --dataset {c['dataset']} does not read; "
             "leave out --stage-to")
    source = Path(data_dir).expanduser()
    _require(source.is_dir() or (is_tar and source.is_file()),
             f"--data-dir {data_dir} does not exist, so --stage-to has nothing to copy")


def _check_unsafe_load_env(env) -> None:
    value = env.get(UNSAFE_LOAD_ENV, "")
    _require(value in ("", "0"),
             f"{UNSAFE_LOAD_ENV}={value} makes torch.load unpickle arbitrary code from "
             "checkpoint files; unset it (checkpoints here never need it)")
