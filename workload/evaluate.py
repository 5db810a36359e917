"""`evaluate`: test-set accuracy and loss of a trained model on any dataset `train` accepts,
in one process or several (the test set is shared out, the sums all-reduced).

A finished run on its own test set (its config.json gives the data, the batch size and the
precision, so the accuracy is the run's final_accuracy):
    evaluate runs/digits
    evaluate runs/digits --json runs/digits/evaluation.json

Other data (the flags given override the run's config.json):
    evaluate runs/pets --dataset imagefolder --data-dir $PROJECT/pets-2025 --batch-size 128
    evaluate runs/wrn/model.json --dataset cifar100 --data-dir $DATA --device cpu

Several GPUs on one node, or a SLURM job (one task per GPU):
    torchrun --nproc-per-node 4 -m workload.evaluate runs/wrn --data-dir $DATA
    srun --ntasks-per-node 4 --gpus-per-task 1 evaluate runs/wrn --data-dir $DATA

Prints one line; --json PATH writes {"accuracy", "loss", "images", "correct", ...}. A
missing or damaged model (model.json, model.safetensors) is refused with exit status 2.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from workload.caches import use_private_caches
from workload.commands import command_parser, main_of
from workload.config import (TrainConfig, add_flags, given, image_size_of, read_config_file,
                             validate)
from workload.errors import UsageError
from workload.files import output_file_problem
from workload.launch.preemption import StartUpFlag
from workload.models import ModelDescription, ModelFiles, locate, read_description

PROG = "evaluate"
# The settings evaluation reads (the data, its batching, the device and numerics); the
# others of a run's config.json (optimiser, checkpoints, output) do not apply.
EVAL_KEYS = {"dataset", "data_dir", "image_size", "synthetic_size", "num_classes", "workers",
             "data_backend", "batch_size", "device", "precision", "channels_last",
             "dist_timeout_s"}


def build_parser() -> argparse.ArgumentParser:
    p = command_parser(PROG, __doc__)
    p.add_argument("model", metavar="RUN_DIR_OR_MODEL",
                   help="a finished train run's --output-dir, or its model.json")
    p.add_argument("--json", metavar="PATH", help="also write the result to this JSON file")
    add_flags(p, only=EVAL_KEYS)
    return p


def eval_config(args: argparse.Namespace, files: ModelFiles,
                description: ModelDescription) -> TrainConfig:
    """The run's settings (or, for a bare model.json, its dataset and input size), the
    flags given on top; validated."""
    if files.run is not None:
        base = read_config_file(str(files.run.config))
    else:
        base = dict(dataset=description.dataset, num_classes=description.num_classes)
    values = {k: v for k, v in base.items() if k in EVAL_KEYS}
    values.setdefault("image_size", description.image_size)
    values.update({k: v for k, v in given(args).items() if v is not None})
    return validate(TrainConfig().replace(**values))


def checked(args: argparse.Namespace) -> tuple[ModelFiles, TrainConfig]:
    """Everything checked with the standard library: the model files, the settings, the
    --json folder."""
    files = locate(args.model)
    cfg = eval_config(args, files, read_description(files.description))
    if args.json:
        problem = output_file_problem(args.json)
        if problem:
            raise UsageError(f"--json {args.json} cannot be written ({problem})")
    return files, cfg


def check_data(description: ModelDescription, data) -> None:
    """The data's classes are the model's: the same count, the same names where known."""
    if data.num_classes != description.num_classes:
        raise UsageError(f"the model has {description.num_classes} classes but the data "
                         f"{data.num_classes}; evaluate it on data of its own classes")
    if description.classes and data.classes and description.classes != data.classes:
        raise UsageError(f"the data's class folders ({', '.join(data.classes[:5])}, ...) are "
                         f"not the model's ({', '.join(description.classes[:5])}, ...); "
                         "name the folders as in training")


def evaluate(files: ModelFiles, cfg: TrainConfig, flag: StartUpFlag) -> dict:
    from workload.models import load_described
    from workload.training.build import start_process

    description, model = load_described(files)  # a damaged model: refused before any work
    with start_process(cfg, flag) as (info, precision):
        return evaluate_in_process(cfg, files, description, model, info, precision)


def evaluate_in_process(cfg: TrainConfig, files: ModelFiles, description: ModelDescription,
                        model, info, precision: str) -> dict:
    """The test split shared out over the ranks, the model's sums all-reduced."""
    import torch

    from workload.data import build_data
    from workload.distributed import batch_that_fits
    from workload.training.trainer import evaluate_model

    data = build_data(cfg, info.device, info.rank, info.world_size, info.local_world_size,
                      for_training=False)
    check_data(description, data)
    model = model.to(info.device)
    if cfg.hardware.channels_last:
        model = model.to(memory_format=torch.channels_last)
    with batch_that_fits(cfg.training.batch_size, image_size_of(cfg), info.device):
        result = evaluate_model(model, data.test, precision, info.device)
    return dict(accuracy=result.accuracy, loss=result.loss, images=result.images,
                correct=result.correct, model=str(files.description),
                dataset=cfg.data.dataset, batch_size=cfg.training.batch_size,
                device=str(info.device), precision=precision, world_size=info.world_size,
                is_main=info.is_main)


def run(args: argparse.Namespace, early: StartUpFlag) -> dict:
    files, cfg = checked(args)
    use_private_caches(PROG)  # before torch is imported
    record = evaluate(files, cfg, early)
    if record.pop("is_main"):
        print(f"{PROG}: accuracy {record['accuracy']:.4f} ({record['correct']}/"
              f"{record['images']} images), loss {record['loss']:.4f} on the "
              f"{record['dataset']} test split")
        if args.json:
            from workload.files import write_json
            write_json(Path(args.json).expanduser(), record)
    return record


main = main_of(PROG, build_parser(), run, takes_flag=True)


if __name__ == "__main__":
    sys.exit(main())
