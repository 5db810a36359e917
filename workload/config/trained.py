"""`model.json`: what a trained model is, beside its weights in `model.safetensors`.

Written by `train` at the end of every run; read by `evaluate`, `predict` and
`workload.models.load_trained`. Standard library only: the commands find and check the
file (missing, not JSON, fields of the wrong type) before they import torch.

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

from workload.config.derived import image_size_of, resolve_stem
from workload.config.schema import TrainConfig
from workload.errors import UsageError

MODEL_JSON, WEIGHTS = "model.json", "model.safetensors"
FORMAT, FORMAT_VERSION = "hpc-train-model", 1
RESIZES = ("stretch", "resize-crop")


def describe_model(cfg: TrainConfig, num_classes: int, classes: list[str] | None,
                   mean, std) -> dict:
    """model.json's content for a run of `cfg` on data of these classes and normalisation."""
    m, size = cfg.model, image_size_of(cfg)
    return dict(format=FORMAT, format_version=FORMAT_VERSION, weights=WEIGHTS, model=m.name,
                arguments=dict(width=m.width, blocks_per_stage=m.blocks_per_stage,
                               dropout=m.dropout, stem=resolve_stem(cfg), image_size=size),
                num_classes=num_classes, classes=classes, dataset=cfg.data.dataset,
                input=dict(image_size=size, mean=list(mean), std=list(std),
                           resize="resize-crop" if cfg.data.dataset == "imagefolder"
                           else "stretch"))


@dataclass(frozen=True)
class ModelFiles:
    """Where a trained model lives: its model.json, its weights, and the run folder that
    holds both when there is one (its config.json gives `evaluate` the data settings)."""
    description: Path
    weights: Path
    run_dir: Path | None


def locate(given: str) -> ModelFiles:
    """RUN_DIR, RUN_DIR/model.json or RUN_DIR/model.safetensors: both files, or a UsageError."""
    path = Path(given).expanduser()
    if not path.exists():
        raise UsageError(f"{given} does not exist; pass a finished train run's --output-dir "
                         "(it holds model.json and model.safetensors) or its model.json")
    if path.is_dir():
        folder, description = path, path / MODEL_JSON
    elif path.suffix == ".safetensors":
        folder, description = path.parent, path.parent / MODEL_JSON
    else:
        folder, description = path.parent, path
    if not description.is_file():
        raise UsageError(f"{given}: no {description} (a train run writes model.json and "
                         "model.safetensors into its --output-dir when it ends); pass a "
                         "finished run's folder or its model.json")
    weights = folder / read_description(description).weights
    if not weights.is_file():
        raise UsageError(f"{given}: the weights {weights} that {description.name} names are "
                         "missing; pass a finished run's folder")
    run_dir = folder if (folder / "config.json").is_file() else None
    return ModelFiles(description, weights, run_dir)


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
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError) as error:
        raise UsageError(f"{path} cannot be read ({error}); pass a finished run's folder"
                         ) from None
    except json.JSONDecodeError as error:
        raise UsageError(f"{path} is not JSON ({error.msg}, line {error.lineno}): the model "
                         "description is damaged; train the run again or restore the file"
                         ) from None
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
    args, given = data["arguments"], data["input"]
    classes, num_classes = data["classes"], _int(data["num_classes"], "num_classes")
    if classes is not None and (not isinstance(classes, list) or len(classes) != num_classes
                                or not all(isinstance(c, str) for c in classes)):
        raise ValueError(f"classes must be null or {num_classes} names")
    if not isinstance(args, dict) or given["resize"] not in RESIZES:
        raise ValueError("arguments must be an object and input.resize one of "
                         + ", ".join(RESIZES))
    if Path(str(data["weights"])).name != data["weights"]:
        raise ValueError("weights must be a file name beside model.json")
    mean, std = (tuple(_numbers(given[k], k)) for k in ("mean", "std"))
    if any(s <= 0 for s in std):
        raise ValueError("input.std must be positive")
    return ModelDescription(str(data["model"]), args, num_classes, classes,
                            _int(given["image_size"], "image_size"), mean, std,
                            given["resize"], str(data["dataset"]), str(data["weights"]))


def _int(value, name: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return value


def _numbers(value, name: str) -> list[float]:
    if (not isinstance(value, list) or len(value) != 3
            or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)):
        raise ValueError(f"input.{name} must be three numbers, got {value!r}")
    return [float(v) for v in value]
