"""`model.json`: what a trained model is, beside its weights in `model.safetensors`.

Written by `train` at the end of every run; read by `evaluate`, `predict` and
`workload.models.load_trained`. Standard library and config/ only, so the commands find
and check the file before they import torch (importing `workload.models` loads no torch
until a torch name is used): strict JSON (no NaN, no Infinity), every field typed and
range-checked, the model's arguments within the bounds of train's config fields, so a
damaged or hostile file is one usage error and never a model of absurd size.

    {"format": "hpc-train-model", "format_version": 1, "weights": "model.safetensors",
     "model": "wrn", "arguments": {"width": 160, "blocks_per_stage": 2, "dropout": 0.01,
                                   "stem": "small", "image_size": 32},
     "num_classes": 100, "classes": null or ["cat", "dog", ...], "dataset": "cifar100",
     "input": {"image_size": 32, "resize": "stretch" or "resize-crop",
               "mean": [0.5071, 0.4867, 0.4408], "std": [0.2675, 0.2565, 0.2761]}}

The input is RGB: pixel values / 255, then (x - mean) / std per channel.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from workload.config import (DATASETS, STEMS, TrainConfig, image_size_of, out_of_range,
                             resolve_stem)
from workload.errors import UsageError
from workload.files import strict_json
from workload.runfolder import WEIGHTS, RunFolder

FORMAT = "hpc-train-model"
FORMAT_VERSION = 1
RESIZES = ("stretch", "resize-crop")
# build_model's keyword arguments that model.json's "arguments" may hold.
ARGUMENTS = ("width", "blocks_per_stage", "dropout", "stem", "image_size")
# The normalisation of pixel values / 255 (in [0, 1]): a mean within, a standard deviation
# at most 0.5 in theory, and not so small that a division makes every logit infinite.
MEAN_BOUNDS = (0.0, 1.0)
STD_BOUNDS = (1e-3, 1.0)


def describe_model(cfg: TrainConfig, num_classes: int, classes: list[str] | None,
                   mean, std) -> dict:
    """model.json's content for a run of `cfg` on data of these classes and normalisation."""
    m = cfg.model
    size = image_size_of(cfg)
    return dict(format=FORMAT, format_version=FORMAT_VERSION, weights=WEIGHTS, model=m.name,
                arguments=dict(width=m.width, blocks_per_stage=m.blocks_per_stage,
                               dropout=m.dropout, stem=resolve_stem(cfg), image_size=size),
                num_classes=num_classes, classes=classes, dataset=cfg.data.dataset,
                input=dict(image_size=size, mean=list(mean), std=list(std),
                           resize="resize-crop" if cfg.data.dataset in ("imagefolder", "shards")
                           else "stretch"))


@dataclass(frozen=True)
class ModelFiles:
    """Where a trained model lives: its model.json, its weights, and the run folder that
    holds both when there is one (its config.json gives `evaluate` the data settings)."""
    description: Path
    weights: Path
    run: RunFolder | None


def locate(given: str) -> ModelFiles:
    """RUN_DIR, RUN_DIR/model.json or RUN_DIR/model.safetensors: both files, or a UsageError."""
    path = Path(given).expanduser()
    if not path.exists():
        raise UsageError(f"{given} does not exist; pass a finished train run's --output-dir "
                         "(it holds model.json and model.safetensors) or its model.json")
    run = RunFolder(path if path.is_dir() else path.parent)
    description = run.model if path.is_dir() or path.suffix == ".safetensors" else path
    if not description.is_file():
        raise UsageError(f"{given}: no {description} (a train run writes model.json and "
                         "model.safetensors into its --output-dir when it ends); pass a "
                         "finished run's folder or its model.json")
    weights = run.root / read_description(description).weights
    if not weights.is_file():
        raise UsageError(f"{given}: the weights {weights} that {description.name} names are "
                         "missing; pass a finished run's folder")
    return ModelFiles(description, weights, run if run.config.is_file() else None)


@dataclass(frozen=True)
class ModelDescription:
    """model.json, checked."""
    model: str
    arguments: dict
    num_classes: int
    classes: list[str] | None
    image_size: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    resize: str
    dataset: str
    weights: str

    def class_name(self, index: int):
        """The class's name where the data had names, else its index."""
        return self.classes[index] if self.classes else index


def read_description(path: Path) -> ModelDescription:
    try:
        data = strict_json(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as error:
        raise UsageError(f"{path} cannot be read ({error}); pass a finished run's folder"
                         ) from None
    except json.JSONDecodeError as error:
        raise UsageError(f"{path} is not JSON ({error.msg}, line {error.lineno}): the model "
                         "description is damaged; train the run again or restore the file"
                         ) from None
    except (ValueError, RecursionError) as error:
        why = str(error) if isinstance(error, ValueError) else "nested too deeply"
        raise UsageError(f"{path} is not strict JSON ({why}): the model description is "
                         "damaged; train the run again or restore the file") from None
    try:
        return _checked(data)
    except (KeyError, TypeError, ValueError) as error:
        raise UsageError(f"{path} is not a model description of this package ({error}); "
                         "pass the model.json a train run wrote") from None


def _checked(data) -> ModelDescription:
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ValueError(f"no \"format\": \"{FORMAT}\"")
    if data.get("format_version") != FORMAT_VERSION:
        raise ValueError(f"format_version {data.get('format_version')!r}, expected "
                         f"{FORMAT_VERSION}")
    given = _object(data["input"], "input")
    num_classes = _int(data, "num_classes")
    classes = data["classes"]
    if classes is not None and (not isinstance(classes, list) or len(classes) != num_classes
                                or not all(isinstance(c, str) for c in classes)):
        raise ValueError(f"classes must be null or {num_classes} names")
    if given["resize"] not in RESIZES:
        raise ValueError("input.resize must be one of " + ", ".join(RESIZES))
    weights = _text(data, "weights")
    dataset = _text(data, "dataset")
    if Path(weights).name != weights:
        raise ValueError("weights must be a file name beside model.json")
    if dataset not in DATASETS:
        raise ValueError(f"dataset {dataset!r} is not one of {', '.join(DATASETS)}")
    mean = tuple(_numbers(given["mean"], "mean", MEAN_BOUNDS))
    std = tuple(_numbers(given["std"], "std", STD_BOUNDS))
    return ModelDescription(_text(data, "model"), _arguments(data["arguments"]), num_classes,
                            classes, _int(given, "image_size", "input."),
                            mean, std, given["resize"], dataset, weights)


def _arguments(args) -> dict:
    """The model's arguments, each typed and within its config field's bounds: a model of
    absurd size is refused here, before torch allocates it."""
    args = _object(args, "arguments")
    unknown = sorted(set(args) - set(ARGUMENTS))
    if unknown:
        raise ValueError(f"unknown model arguments {', '.join(unknown)}")
    for key in ("width", "blocks_per_stage"):
        if key in args:
            _int(args, key, "arguments.")
    for key in ("dropout", "image_size"):
        if key in args:
            _within(key, args[key], "arguments.")
    if "stem" in args and args["stem"] not in STEMS:
        raise ValueError(f"arguments.stem must be one of {', '.join(STEMS)}, got "
                         f"{args['stem']!r}")
    return args


def _object(value, name: str) -> dict:
    if not isinstance(value, dict):
        raise ValueError(f"{name} must be an object")
    return value


def _text(data: dict, name: str) -> str:
    value = data[name]
    if not isinstance(value, str) or not value or len(value) > 200:
        raise ValueError(f"{name} must be a short text, got {str(value)[:50]!r}")
    return value


def _int(data: dict, name: str, where: str = "") -> int:
    value = data[name]
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{where}{name} must be a positive integer, got {value!r}")
    return _within(name, value, where)


def _within(key: str, value, where: str):
    """Within the package's bounds of the field (workload.config.bounds: a train
    setting's are its config field's)."""
    if problem := out_of_range(key, value):
        raise ValueError(f"{where}{problem}")
    return value


def _number(value, name: str) -> float:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise ValueError(f"{name} must be a number, got {value!r}")
    return float(value)


def _numbers(value, name: str, bounds: tuple[float, float]) -> list[float]:
    """Three finite numbers within `bounds`: a NaN or 1e-300 gave null probabilities."""
    if not isinstance(value, list) or len(value) != 3:
        raise ValueError(f"input.{name} must be three numbers, got {str(value)[:50]}")
    numbers = [_number(v, f"input.{name}") for v in value]
    if not all(bounds[0] <= v <= bounds[1] for v in numbers):
        raise ValueError(f"input.{name} must be from {bounds[0]} to {bounds[1]} per channel "
                         f"(pixel values / 255), got {numbers}")
    return numbers
