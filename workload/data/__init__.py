"""Datasets (read into uint8 tensors or image folders) and the loaders that feed training.

`build_data(cfg, device, rank, world_size, local_world_size)` is the one entry point: it
chooses the data backend (`--data-backend`, see workload.data.backends), reads the dataset
named by the config and returns the training and test loaders for this rank, with the
backend's name and the reason for the choice.
"""

from __future__ import annotations

import torch

from workload.config import DATA_BACKENDS, TrainConfig
from workload.data.backends import (NATURAL_IMAGE_SIZE, DataBundle, DataRequest, available,
                                    choose)
from workload.errors import UsageError


def build_data(cfg: TrainConfig, device: torch.device, rank: int = 0, world_size: int = 1,
               local_world_size: int = 1, for_training: bool = True) -> DataBundle:
    """The loaders of both splits for this rank; `for_training` also requires at least one
    training step per epoch (evaluation reads the test split only)."""
    name, reason = choose(cfg.data.data_backend, cfg.data.dataset, device)
    req = DataRequest(cfg, device, rank, world_size, local_world_size)
    built = available()[name](req)
    if name == "torch":
        reason += f" ({req.workers} DataLoader workers)"
    if for_training and len(built.train) == 0:
        raise UsageError(no_steps_message(cfg.training.batch_size, built.num_train, world_size))
    return DataBundle(built.train, built.test, built.num_classes, built.num_train, name,
                      reason, built.normalizer.mean, built.normalizer.std,
                      list(built.classes) if built.classes is not None else None)


def no_steps_message(batch_size: int, num_train: int, world_size: int) -> str:
    """Why an epoch would have 0 steps: the batch is larger than a rank's share."""
    share = num_train // world_size
    fix = f"pass --batch-size {share} or less" if share else "use more training images"
    return (f"--batch-size {batch_size} is larger than this process's share of the training "
            f"set ({num_train} images over {world_size} processes: {share} each), so an "
            f"epoch would train 0 steps; {fix}, or run fewer processes")


__all__ = ["DATA_BACKENDS", "NATURAL_IMAGE_SIZE", "DataBundle", "build_data"]
