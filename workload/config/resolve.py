"""From what the user gave to the resolved, validated config: the recipes and device
defaults that fill the flags left out (`build_config`), validation (the first bad value
raises UsageError naming the flag, what was expected and the fix), and the settings that
follow from others (the image side a run trains at, the model's stem). Standard library
only, so every usage error is found, and config.json records the derived settings, before
torch is imported."""

from __future__ import annotations

import importlib.util
import math
import os
from pathlib import Path

from workload.config.schema import (FIELDS, FILE_DATASETS, KEYS, MIN_IMAGE_SIZE, TAR_SUFFIXES,
                                    TrainConfig, example_of, flag_of, out_of_bounds)
from workload.errors import UsageError

# The image side each dataset has when --image-size is 0.
NATURAL_IMAGE_SIZE = {"cifar100": 32, "digits": 32, "synthetic": 32, "imagefolder": 224,
                      "shards": 224}
# Images this large or larger get the ImageNet stem with --stem auto.
IMAGENET_STEM_FROM_PX = 64
# torchvision models whose stem can be swapped for the small-image one (conv1 + maxpool).
RESNET_FAMILY = ("resnet", "resnext", "wide_resnet")


def image_size_of(cfg: TrainConfig) -> int:
    return cfg.data.image_size or NATURAL_IMAGE_SIZE[cfg.data.dataset]


def stems_of(model: str) -> tuple[str, ...]:
    """The stems a model can have: the ResNet family both, the Wide ResNet only its small
    one, every other torchvision model only its own (designed for ImageNet)."""
    if model == "wrn":
        return ("small",)
    if model.startswith(RESNET_FAMILY):
        return ("imagenet", "small")
    return ("imagenet",)


def resolve_stem(cfg: TrainConfig) -> str:
    """`--stem auto` made concrete for this model and image size; a forced stem the model
    does not have is a UsageError."""
    name = cfg.model.name
    wanted = cfg.model.stem
    size = image_size_of(cfg)
    stems = stems_of(name)
    if wanted == "auto":
        if len(stems) == 1:
            return stems[0]
        return "imagenet" if size >= IMAGENET_STEM_FROM_PX else "small"
    if wanted not in stems:
        raise UsageError(f"--stem {wanted}: {name} has only the {stems[0]} stem (only the "
                         f"ResNet family, {', '.join(f'{p}*' for p in RESNET_FAMILY)}, has "
                         "both); leave out --stem")
    return wanted


def describe_stem(cfg: TrainConfig) -> str:
    """The start-up line's words for the stem."""
    stem = resolve_stem(cfg)
    size = image_size_of(cfg)
    name = cfg.model.name
    if len(stems_of(name)) == 1:
        return f"stem: {name}'s own ({stem}-image design) for {size} px images"
    how = ("7x7 stride-2 convolution and max-pool" if stem == "imagenet"
           else "3x3 stride-1 convolution, no max-pool")
    return (f"stem {stem} ({how}) for {size} px images; --stem auto takes imagenet from "
            f"{IMAGENET_STEM_FROM_PX} px")

# Recipes: tuned settings for a (dataset, device) pair, applied only to the flags the user
# did not give. Measured on a 2-core x86_64 CPU: the digits recipe reaches >= 0.90 test
# accuracy in well under five minutes (see README.md, "Quick start").
RECIPES: dict[tuple[str, str], dict] = {
    ("digits", "cpu"): dict(
        name="digits-cpu", width=16, blocks_per_stage=1, batch_size=64, epochs=10,
        base_lr=0.05, warmup_epochs=0.5, target_accuracy=0.97, patience=2,
    ),
}

# Defaults that depend on the device, applied like a recipe to the flags left out:
# channels_last feeds tensor cores without layout conversions on every convolution.
DEVICE_DEFAULTS: dict[str, dict] = {"cuda": dict(channels_last=True)}


def apply_device_defaults(given: dict, device: str) -> dict:
    filled = dict(given)
    for key, value in DEVICE_DEFAULTS.get(device, {}).items():
        if filled.get(key) is None:
            filled[key] = value
    return filled


def apply_recipe(given: dict, device: str) -> dict:
    """Fill the values the user left out (None) from the recipe for this dataset and device."""
    dataset = given.get("dataset") or TrainConfig().data.dataset
    recipe = RECIPES.get((dataset, device))
    if recipe is None:
        return given
    filled = dict(given)
    for key, value in recipe.items():
        if key == "name":
            filled["recipe"] = value
        elif filled.get(key) is None:
            filled[key] = value
    return filled


def build_config(given: dict, device: str | None = None) -> TrainConfig:
    """The validated config from the user's values (None = not given) and, once the device
    type is known, its recipe and defaults. Unknown keys (another tool's flags) are ignored."""
    filled = apply_device_defaults(apply_recipe(given, device), device) if device else given
    values = {k: v for k, v in filled.items()
              if v is not None and (k in TrainConfig().to_dict())}
    return validate(TrainConfig.from_flat(values))

# torch.load ignores weights_only=True when this variable is set.
UNSAFE_LOAD_ENV = "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"


def validate(cfg: TrainConfig) -> TrainConfig:
    flat = cfg.to_dict()
    for check in (_check_text, _check_choices, _check_numbers, _check_special_values,
                  _check_checkpoint, _check_optional_packages, _check_model, _check_data_files):
        check(flat)
    resolve_stem(cfg)  # a forced stem the model lacks
    _check_unsafe_load_env(os.environ)
    return cfg


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise UsageError(message)


def _check_text(c: dict) -> None:
    """No control character in a setting's text: a folder name with a newline splits the
    log lines and printed commands that name it, and the variables set from it."""
    for key in KEYS:
        value = c[key]
        bad = isinstance(value, str) and any(ord(ch) < 32 or ord(ch) == 127 for ch in value)
        _require(not bad, f"{flag_of(key)} {value!r} holds a control character (a newline, "
                          "a tab or an escape); pass a name without one")


def _check_choices(c: dict) -> None:
    for key in KEYS:
        allowed = FIELDS[key].metadata["choices"]
        _require(not allowed or c[key] in allowed,
                 f"{flag_of(key)} {c[key]!r} is not known; choose one of {', '.join(allowed)}")


def _check_numbers(c: dict) -> None:
    """Every number finite (`inf` and `nan` pass some ranges, then train to NaN deep
    inside torch) and within its field's Range (schema.py), with an example to pass."""
    for key in KEYS:
        value = c[key]
        flag = flag_of(key)
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
    _require(not init or init.endswith(".safetensors"),
             f"--init-from {init} is not a .safetensors file; convert the weights first "
             "(see docs/your-data.md, 'Starting from published weights')")
    weights = Path(init).expanduser()
    _require(not init or weights.is_file(),
             f"--init-from {init} {'is not a file' if weights.exists() else 'does not exist'}"
             "; pass the path of a .safetensors file")
    _require(not c["init_reinit_head"] or bool(init),
             "--init-reinit-head only goes with --init-from FILE.safetensors")
    _check_compile(c)


def _check_compile(c: dict) -> None:
    """--compile-mode and --compile-scope shape --compile; blocks are the residual blocks
    of wrn and the ResNet family (workload.models.residual_blocks)."""
    for key, default in (("compile_mode", "default"), ("compile_scope", "model")):
        _require(c["compile"] or c[key] == default,
                 f"{flag_of(key)} {c[key]} shapes torch.compile; add --compile")
    _require(c["compile_scope"] != "blocks" or c["model"] == "wrn"
             or c["model"].startswith(RESNET_FAMILY),
             f"--compile-scope blocks compiles residual blocks, which --model {c['model']} "
             "has none of (wrn and resnet*, resnext*, wide_resnet* have); use "
             "--compile-scope model")


def _check_shards(c: dict) -> None:
    shards = c["shards"]
    if not shards:
        return
    _require(c["dataset"] == "imagefolder" and c["prepare_data"] and not c["stage_to"],
             f"--shards {shards} packs an image folder: it goes with --dataset imagefolder "
             "--data-dir SRC --prepare-data (no --stage-to); train from the shards with "
             f"--dataset shards --data-dir {shards}")
    source, dest = (Path(p).expanduser().resolve() for p in (c["data_dir"], shards))
    _require(not (source == dest or source in dest.parents or dest in source.parents),
             f"--shards {shards} and --data-dir {c['data_dir']} overlap (one holds the "
             "other); pass a --shards folder outside the image folder")


def _check_data_files(c: dict) -> None:
    _check_shards(c)
    data_dir = c["data_dir"]
    stage_to = c["stage_to"]
    is_tar = data_dir.endswith(TAR_SUFFIXES)
    _require(not is_tar or c["dataset"] != "shards",
             f"--dataset shards reads a shard folder, and --data-dir {data_dir} is a tar "
             "file; pass the folder that holds manifest.json (--stage-to copies it)")
    _require(not is_tar or bool(stage_to),
             f"--data-dir {data_dir} is a tar file: add --stage-to DIR (e.g. $SLURM_TMPDIR) "
             "to unpack it on each node, or unpack it yourself")
    if not stage_to:
        return
    _require(c["dataset"] in FILE_DATASETS,
             f"--stage-to copies --data-dir, which --dataset {c['dataset']} does not read; "
             "leave out --stage-to")
    source = Path(data_dir).expanduser()
    _require(source.is_dir() or (is_tar and source.is_file()),
             f"--data-dir {data_dir} does not exist, so --stage-to has nothing to copy")
    # Links resolved: a staged copy inside the dataset becomes part of it (a class more
    # for every later run), and a dataset inside the staging folder is copied into itself.
    read = source.resolve()
    staged = Path(stage_to).expanduser().resolve()
    _require(not source.is_dir() or not (read == staged or read in staged.parents
                                         or staged in read.parents),
             f"--stage-to {stage_to} and --data-dir {data_dir} overlap ({staged} and {read}: "
             "one holds the other), so the copy would go into the dataset; pass a --stage-to "
             "outside it, such as $SLURM_TMPDIR")


def _check_unsafe_load_env(env) -> None:
    value = env.get(UNSAFE_LOAD_ENV, "")
    _require(value in ("", "0"),
             f"{UNSAFE_LOAD_ENV}={value} makes torch.load unpickle arbitrary code from "
             "checkpoint files; unset it (checkpoints here never need it)")
