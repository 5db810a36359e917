"""Validation of a TrainConfig: the first bad value raises UsageError naming the flag, what
was expected and the fix. Standard library only, so every usage error is found before
torch is imported."""

from __future__ import annotations

import importlib.util
import math
import os
from pathlib import Path

from workload.config.derived import resolve_stem
from workload.config.schema import (FIELDS, KEYS, MIN_IMAGE_SIZE, TrainConfig, flag_of,
                                    out_of_bounds)
from workload.errors import UsageError

# torch.load ignores weights_only=True when this variable is set.
UNSAFE_LOAD_ENV = "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"


def validate(cfg: TrainConfig) -> TrainConfig:
    flat = cfg.to_dict()
    for check in (_check_choices, _check_positive_ints, _check_finite, _check_bounds,
                  _check_limits, _check_ranges, _check_checkpoint, _check_optional_packages, _check_model,
                  _check_data_files):
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


# Integer settings that must be 1 or more, with an example for the message.
_POSITIVE_INTS = dict(batch_size=256, epochs=100, patience=2, width=160, blocks_per_stage=2,
                      synthetic_size=10_000, num_classes=100, keep_checkpoints=3)


def _check_positive_ints(c: dict) -> None:
    for key, example in _POSITIVE_INTS.items():
        value, flag = c[key], flag_of(key)
        _require(isinstance(value, int) and value >= 1,
                 f"{flag} must be a positive integer (1 or more), got {value!r}; pass e.g. "
                 f"{flag} {example}")


def _check_finite(c: dict) -> None:
    """Every number a finite one: `inf` and `nan` pass the range checks of some fields
    and then train to NaN or overflow deep inside torch."""
    for key in KEYS:
        value = c[key]
        if isinstance(value, float):
            _require(math.isfinite(value), f"{flag_of(key)} must be a finite number, got "
                                           f"{value!r}")


def _check_bounds(c: dict) -> None:
    """The fields' own bounds (schema.py): past them a model only exhausts memory."""
    for key in KEYS:
        problem = out_of_bounds(key, c[key])
        default = getattr(getattr(TrainConfig(), KEYS[key][0]), KEYS[key][1])
        _require(not problem, f"{flag_of(key)} {problem}; pass e.g. {flag_of(key)} {default}")


# Upper limits past which a value only ever breaks a run: an overflow in the schedule or a
# seed beyond what the random generators take. (flat key: (limit, example))
MAX_SEED = 2**32 - 1  # what numpy's and most generators' seeds hold
LIMITS = dict(base_lr=(1000.0, "0.01"), weight_decay=(1.0, "5e-4"),
              warmup_epochs=(1e6, "1"), dist_timeout_s=(7 * 24 * 3600.0, "600"),
              seed=(MAX_SEED, "0"))


def _check_limits(c: dict) -> None:
    for key, (limit, example) in LIMITS.items():
        flag, most = flag_of(key), f"{limit:g}" if isinstance(limit, float) else limit
        _require(c[key] <= limit, f"{flag} {c[key]!r} is beyond any useful value (at most "
                                  f"{most}); pass e.g. {flag} {example}")
    _require(c["seed"] >= 0, f"--seed must be 0 or more, got {c['seed']!r}; pass e.g. "
                             "--seed 0")


def _check_ranges(c: dict) -> None:
    _require(c["base_lr"] > 0, f"--base-lr must be greater than 0, got {c['base_lr']!r}; "
                               "pass e.g. --base-lr 0.01")
    _require(0 <= c["momentum"] < 1, f"--momentum must be in [0, 1), got {c['momentum']!r}")
    _require(c["weight_decay"] >= 0,
             f"--weight-decay must be 0 or more, got {c['weight_decay']!r}")
    _require(c["warmup_epochs"] >= 0,
             f"--warmup-epochs must be 0 or more, got {c['warmup_epochs']!r}")
    _require(0 <= c["label_smoothing"] < 1,
             f"--label-smoothing must be in [0, 1), got {c['label_smoothing']!r}")
    _require(0 < c["target_accuracy"] <= 1,
             f"--target-accuracy is a fraction in (0, 1], got {c['target_accuracy']!r}; "
             "pass e.g. --target-accuracy 0.95 for 95 %")
    _require(c["max_steps"] >= 0,
             f"--max-steps must be 0 (no limit) or more, got {c['max_steps']!r}")
    _require(c["image_size"] >= 0, f"--image-size must be 0 (the dataset's own) or more, "
                                   f"got {c['image_size']!r}")
    _require(c["image_size"] == 0 or c["image_size"] >= MIN_IMAGE_SIZE,
             f"--image-size {c['image_size']} is too small for the models' pooling; use "
             f"{MIN_IMAGE_SIZE} or more")
    _require(c["workers"] >= -1, f"--workers must be -1 (automatic) or more, got {c['workers']!r}")
    _require(bool(c["output_dir"]), "--output-dir must not be empty")
    _require(c["log_every"] >= 0, f"--log-every must be 0 (about every 30 s in batch logs) "
                                  f"or a number of steps, got {c['log_every']!r}")
    _require(c["dist_timeout_s"] > 0, f"--dist-timeout must be more than 0 seconds, got "
                                      f"{c['dist_timeout_s']!r}; pass e.g. --dist-timeout 600")


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
