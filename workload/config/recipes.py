"""Tuned recipes and device defaults: values for the flags a user left out.

`build_config(given, device)` is the one way to a TrainConfig from what the user gave
(`key -> value`, None = not given): recipe first, then the device's defaults, then the
dataclass defaults, then validation.
"""

from __future__ import annotations

from workload.config.schema import TrainConfig
from workload.config.validate import validate

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
