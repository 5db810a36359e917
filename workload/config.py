"""The one typed, validated training configuration, and the tuned quick-start recipes.

The resolved config is written to `<output-dir>/config.json` so a run says exactly what it
did. Command-line parsing lives in `workload.train`; this module knows nothing of argparse.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field

from workload.checkpoint import check_checkpoint_flags
from workload.errors import UsageError
from workload.models import MODELS

DATASETS = ("cifar100", "imagefolder", "synthetic", "digits")
DATA_BACKENDS = ("auto", "device", "dali", "torch")
DEVICES = ("auto", "cpu", "cuda")
STRATEGIES = ("ddp", "fsdp")
LR_SCALINGS = ("none", "linear")
PRECISIONS = ("auto", "fp32", "tf32", "bf16", "fp16")


@dataclass
class TrainConfig:
    model: str = "wrn"
    # One of MODELS; "wrn" is the reference Wide ResNet of the Olivia guide.
    width: int = 160
    # Wide ResNet width of the first stage; the next two stages are 2x and 4x as wide.
    blocks_per_stage: int = 2
    # Wide ResNet residual blocks per stage (the reference has 2).
    dropout: float = 0.01
    # Dropout between the two convolutions of a residual block (the reference's 0.01).

    dataset: str = "cifar100"
    # One of DATASETS.
    data_dir: str = "data"
    # Where the dataset lives (cifar100: the folder holding cifar-100-python/;
    # imagefolder: the folder holding train/ and val/).
    download: bool = False
    # Fetch CIFAR-100 through torchvision first (needs internet; compute nodes rarely have it).
    image_size: int = 0
    # Side of the square training images; 0 = the dataset's own (32, or 224 for imagefolder).
    synthetic_size: int = 10_000
    # Number of synthetic training images (the test split gets a fifth of that).
    num_classes: int = 100
    # Classes of the synthetic dataset; the other datasets know their own.

    device: str = "auto"
    # "auto" takes CUDA when a GPU is visible, else the CPU.
    precision: str = "auto"
    # fp32, tf32 (TF32 matmuls/convolutions on Ampere and newer), bf16 or fp16 autocast;
    # "auto" = bf16 on GPUs that support it, fp32 elsewhere.
    channels_last: bool = False
    # NHWC memory format, faster for convolutions with tensor cores and on recent CPUs;
    # on by default on CUDA (see DEVICE_DEFAULTS), off on the CPU unless asked for.
    compile: bool = False
    # torch.compile the model; compile time is reported apart from throughput.

    batch_size: int = 256
    # Images per optimizer step on each process (the reference's --batch-size).
    epochs: int = 100
    # Passes over the training set (the reference's --epochs).
    max_steps: int = 0
    # Stop after this many optimizer steps in all; 0 = no limit (for smoke runs).
    base_lr: float = 0.01
    # Peak learning rate (the reference's --base-lr), reached after the warm-up.
    momentum: float = 0.9
    weight_decay: float = 5e-4
    warmup_epochs: float = 1.0
    # Linear warm-up from 0 to base_lr over this many epochs, then cosine decay to 0.
    label_smoothing: float = 0.0
    target_accuracy: float = 0.95
    # Stop early when `patience` consecutive epochs reach this test accuracy (the reference's).
    patience: int = 2
    strategy: str = "ddp"
    # How several processes share the model: ddp (a full replica each) or fsdp (FSDP2
    # fully_shard: parameters, gradients and optimizer state sharded across ranks).
    lr_scaling: str = "none"
    # "linear" multiplies base_lr by the number of processes, for a global batch that grows
    # with them; "none" keeps base_lr as given (the reference job scripts' behaviour).
    dist_timeout_s: float = 600.0
    # Process-group timeout: a rank waiting longer than this in a collective fails.
    seed: int = 0
    # Seeds model init, data order and augmentation: same seed, same result on the CPU.
    workers: int = -1
    # DataLoader worker processes (DALI threads); -1 = derived from SLURM_CPUS_PER_TASK or
    # the CPUs this process may use.
    data_backend: str = "auto"
    # One of DATA_BACKENDS: device (in-memory sets, batched on the training device), dali,
    # torch (classic DataLoader); "auto" chooses and prints why (workload.data.backends).

    tensorboard: bool = False
    # Also write the per-epoch metrics as TensorBoard event files into <output-dir>/tensorboard.
    output_dir: str = field(default_factory=lambda: time.strftime("runs/%Y%m%d-%H%M%S"))
    # Receives config.json, metrics.jsonl, summary.json and checkpoints/.

    resume: str = "auto"
    # "auto": continue from the newest complete, verified checkpoint in the output directory;
    # "never": start afresh (refused if the directory holds checkpoints, unless --overwrite);
    # or the path of one checkpoint directory to load.
    overwrite: bool = False
    # With --resume never: replace the checkpoints and records already in the output directory.
    checkpoint_every: str = "30m"
    # Also checkpoint every N optimizer steps ("500") or every so often ("10m", "90s", "1h");
    # "0" = only at epoch ends (every epoch end always saves one).
    keep_checkpoints: int = 3
    # Complete checkpoints kept; older ones are pruned only after a new one is complete.
    preempt_signal: str = "USR2"
    # The signal that asks for a checkpoint and a requeue (SIGTERM always does too).
    recipe: str = ""
    # Name of the tuned recipe that filled the flags the user left out, if any.

    def validate(self) -> "TrainConfig":
        """Raise UsageError naming the first bad value, what was expected and the fix."""
        for check in _CHECKS:
            check(self)
        return self

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise UsageError(message)


def _check_choices(cfg: TrainConfig) -> None:
    for name, allowed in (("model", MODELS), ("dataset", DATASETS),
                          ("device", DEVICES), ("precision", PRECISIONS),
                          ("strategy", STRATEGIES), ("lr_scaling", LR_SCALINGS),
                          ("data_backend", DATA_BACKENDS)):
        value, flag = getattr(cfg, name), "--" + name.replace("_", "-")
        _require(value in allowed, f"{flag} {value!r} is not known; choose one of "
                                   f"{', '.join(allowed)}")


def _check_positive_ints(cfg: TrainConfig) -> None:
    for name, example in (("batch_size", 256), ("epochs", 100), ("patience", 2),
                          ("width", 160), ("blocks_per_stage", 2),
                          ("synthetic_size", 10_000), ("num_classes", 100)):
        value = getattr(cfg, name)
        flag = "--" + name.replace("_", "-")
        _require(isinstance(value, int) and value >= 1,
                 f"{flag} must be a positive integer, got {value!r}; "
                 f"pass e.g. {flag} {example}")


def _check_ranges(cfg: TrainConfig) -> None:
    _require(cfg.base_lr > 0, f"--base-lr must be greater than 0, got {cfg.base_lr!r}; "
                              "pass e.g. --base-lr 0.01")
    _require(0 <= cfg.momentum < 1, f"--momentum must be in [0, 1), got {cfg.momentum!r}")
    _require(cfg.weight_decay >= 0, f"--weight-decay must be 0 or more, got {cfg.weight_decay!r}")
    _require(cfg.warmup_epochs >= 0,
             f"--warmup-epochs must be 0 or more, got {cfg.warmup_epochs!r}")
    _require(0 <= cfg.label_smoothing < 1,
             f"--label-smoothing must be in [0, 1), got {cfg.label_smoothing!r}")
    _require(0 <= cfg.dropout < 1, f"--dropout must be in [0, 1), got {cfg.dropout!r}")
    _require(0 < cfg.target_accuracy <= 1,
             f"--target-accuracy is a fraction in (0, 1], got {cfg.target_accuracy!r}; "
             "pass e.g. --target-accuracy 0.95 for 95 %")
    _require(cfg.max_steps >= 0,
             f"--max-steps must be 0 (no limit) or more, got {cfg.max_steps!r}")
    _require(cfg.image_size >= 0, f"--image-size must be 0 (the dataset's own) or more, "
                                  f"got {cfg.image_size!r}")
    _require(cfg.image_size == 0 or cfg.image_size >= 8,
             f"--image-size {cfg.image_size} is too small for the models' pooling; use 8 or more")
    _require(cfg.workers >= -1, f"--workers must be -1 (automatic) or more, got {cfg.workers!r}")
    _require(bool(cfg.output_dir), "--output-dir must not be empty")
    _require(cfg.dist_timeout_s > 0, f"--dist-timeout must be more than 0 seconds, got "
                                     f"{cfg.dist_timeout_s!r}; pass e.g. --dist-timeout 600")


def _check_optional_packages(cfg: TrainConfig) -> None:
    if cfg.tensorboard:
        from workload.tensorboard import require_tensorboard
        require_tensorboard()


# The checkpoint flags' rules live with the feature (workload/checkpoint.py).
_CHECKS = (_check_choices, _check_positive_ints, _check_ranges, check_checkpoint_flags,
           _check_optional_packages)


# Recipes: tuned settings for a (dataset, device) pair, applied only to the flags the user
# did not give. Measured on a 2-core x86_64 CPU: the digits recipe reaches >= 0.90 test
# accuracy in well under five minutes (see README, "Quick start").
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
    dataset = given.get("dataset") or TrainConfig.dataset
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


def build_config(given: dict, device: str) -> TrainConfig:
    """The validated config from the user's values (None = not given) and any recipe."""
    filled = apply_device_defaults(apply_recipe(given, device), device)
    known = {f.name for f in dataclasses.fields(TrainConfig)}
    values = {k: v for k, v in filled.items() if k in known and v is not None}
    return TrainConfig(**values).validate()
