"""The networks: the reference Wide ResNet (`wrn`) and every torchvision classification
model by name, with the stem for the image size; weights in and out as safetensors; a
finished run's model.json.

    networks.py     build_model by `--model` name: the Wide ResNet of the Olivia guide and
                    torchvision's models (close matches for a wrong name), the stems
    weights.py      --init-from FILE.safetensors, model.safetensors at the end of a run, and
                    load_trained(RUN_DIR), model_input(RUN_DIR): a finished run's model
                    (model.json + its weights) and the normalisation of its input
    description.py  model.json: what train writes and what evaluate and predict check
                    before they import torch

The rule: importing this package imports no torch. The model.json names are imported here
(description.py is torch-free); the torch names (networks.py, weights.py) load on their
first use through the module's __getattr__, so `evaluate` and `predict` answer usage
errors and refuse a bad model.json before torch is imported. Import from the package, not
its modules.
"""

from __future__ import annotations

import importlib

from workload.models.description import (ModelDescription, ModelFiles, describe_model, locate,
                                         read_description)

# Each torch name -> the module that holds it, imported on the name's first use.
_TORCH_NAMES = {
    **dict.fromkeys(("ResidualBlock", "WideResNet", "build_model", "check_model_name",
                     "conv_bn_relu", "count_parameters", "model_for", "residual_blocks",
                     "small_image_stem"),
                    "networks"),
    **dict.fromkeys(("load_described", "load_initial_weights", "load_trained", "model_input",
                     "save_weights"), "weights"),
}


def __getattr__(name: str):
    if name not in _TORCH_NAMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_TORCH_NAMES[name]}"), name)


__all__ = ["ModelDescription", "ModelFiles", "describe_model", "locate", "read_description",
           *_TORCH_NAMES]
