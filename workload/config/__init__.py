"""The one typed training configuration: sections by concern, flags generated from them,
validation and tuned recipes. Standard library only: the command-line tools parse and
validate here before they import torch.

    schema.py    the dataclasses (model, data, training, hardware, distributed,
                 checkpoint, logging): each field's default and help in one place
    values.py    typed values a flag gives as text (`--checkpoint-every 10m` -> Every)
    flags.py     argparse groups generated from the fields
    validate.py  one UsageError naming the first bad value and the fix
    recipes.py   tuned values for the flags left out, and `build_config`

The resolved config is written to `<output-dir>/config.json` (flat: key = flag name with
underscores) so a run says exactly what it did.
"""

from workload.config.flags import add_flags, given
from workload.config.recipes import DEVICE_DEFAULTS, RECIPES, build_config
from workload.config.schema import (DATA_BACKENDS, DATASETS, DEVICES, LR_SCALINGS,
                                    MAY_CHANGE_ON_RESUME, MODELS, PRECISIONS, PREEMPT_SIGNALS,
                                    STRATEGIES, TrainConfig, flag_of)
from workload.config.validate import UNSAFE_LOAD_ENV, validate
from workload.config.values import Every

__all__ = ["DATASETS", "DATA_BACKENDS", "DEVICES", "DEVICE_DEFAULTS", "Every", "LR_SCALINGS",
           "MAY_CHANGE_ON_RESUME", "MODELS", "PRECISIONS", "PREEMPT_SIGNALS", "RECIPES", "STRATEGIES",
           "TrainConfig", "UNSAFE_LOAD_ENV", "add_flags", "build_config", "flag_of", "given",
           "validate"]
