"""The one typed training configuration: sections by concern, flags generated from them,
validation and tuned recipes. Standard library (and the bottom layer's errors) only: the
command-line tools parse and validate here before they import torch. Import from the
package, not its modules.

    schema.py    the dataclasses (model, data, training, hardware, distributed,
                 checkpoint, logging): each field's default, help, bounds and example
    values.py    typed values a flag gives as text (`--checkpoint-every 10m` -> Every)
                 and the Range a number must be in
    bounds.py    the one table of bounds of what the package reads back from files
    sources.py   argparse groups generated from the fields, and `--config FILE`
    resolve.py   recipes and device defaults for the flags left out (`build_config`),
                 validation (one UsageError naming the first bad value and the fix), and
                 what follows from other settings (image size, stem)

The resolved config is written to `<output-dir>/config.json` (flat: key = flag name with
underscores) so a run says exactly what it did.
"""

from workload.config.bounds import (MAX_BYTES, MAX_COUNT, MAX_RANKS, RECORD_BOUNDS,
                                    out_of_range, record_problem)
from workload.config.resolve import (DEVICE_DEFAULTS, NATURAL_IMAGE_SIZE, RECIPES,
                                     UNSAFE_LOAD_ENV, build_config, describe_stem,
                                     image_size_of, resolve_stem, stems_of, validate)
from workload.config.schema import (DATA_BACKENDS, DATASETS, DEVICES, FIELDS, FILE_DATASETS,
                                    KEYS, LR_SCALINGS, MAY_CHANGE_ON_RESUME, MIN_IMAGE_SIZE, MODELS,
                                    ONE_SHOT,
                                    PRECISIONS, PREEMPT_SIGNALS, STEMS, STRATEGIES, TAR_SUFFIXES,
                                    TrainConfig,
                                    flag_of, out_of_bounds)
from workload.config.sources import add_flags, given, read_config_file, repeatable
from workload.config.values import Every

__all__ = ["MAX_BYTES", "MAX_COUNT", "MAX_RANKS", "RECORD_BOUNDS", "out_of_range", "record_problem",
           "DATASETS", "DATA_BACKENDS", "DEVICES", "DEVICE_DEFAULTS", "Every", "FIELDS",
           "FILE_DATASETS", "KEYS", "LR_SCALINGS", "MAY_CHANGE_ON_RESUME", "MIN_IMAGE_SIZE",
           "MODELS",
           "NATURAL_IMAGE_SIZE", "ONE_SHOT",
           "PRECISIONS", "PREEMPT_SIGNALS", "RECIPES", "STEMS", "STRATEGIES", "TAR_SUFFIXES",
           "TrainConfig",
           "UNSAFE_LOAD_ENV", "add_flags", "build_config", "describe_stem", "flag_of", "given",
           "image_size_of", "out_of_bounds", "read_config_file", "repeatable", "resolve_stem",
           "stems_of", "validate"]
