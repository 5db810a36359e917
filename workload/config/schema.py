"""The training configuration: one dataclass per concern, each field with its help and
default in one place. The command-line flags are generated from these fields
(workload.config.sources): a field `batch_size` is the flag `--batch-size` unless its
metadata names another flag. Field names are unique across sections, so the flat
`name -> value` mapping (config.json, recipes, resume checks) is lossless.
"""

# No `from __future__ import annotations`: the fields' types are read at run time
# (workload.config.sources gives them to argparse).
import dataclasses
import time
from dataclasses import dataclass, field

from workload.config.values import WEEK, Every, Range

# The built-in network; every torchvision classification model name is accepted too, checked
# against torchvision's registry once torch is imported (workload.models.check_model_name).
MODELS = ("wrn",)
STEMS = ("auto", "imagenet", "small")
DATASETS = ("cifar100", "imagefolder", "shards", "synthetic", "digits")
# The datasets read from --data-dir (the others are made in memory or ship with the package).
FILE_DATASETS = ("cifar100", "imagefolder", "shards")
# An image folder packed as a tar (--data-dir with --stage-to); longest first, so the
# staged folder's name drops the whole suffix.
TAR_SUFFIXES = (".tar.gz", ".tgz", ".tar")
DATA_BACKENDS = ("auto", "device", "dali", "torch")
DEVICES = ("auto", "cpu", "cuda")
PRECISIONS = ("auto", "fp32", "tf32", "bf16", "fp16")
STRATEGIES = ("ddp", "fsdp")
# torch.compile's modes that train offers (reduce-overhead: CUDA graphs over the compiled
# forward and backward) and what it compiles: the whole model, each residual block, or the
# whole step (the model with its loss, and the optimizer step: training/step_graph.py).
COMPILE_MODES = ("default", "max-autotune-no-cudagraphs", "reduce-overhead")
COMPILE_SCOPES = ("model", "blocks", "step")
LR_SCALINGS = ("none", "linear")
# Signals --preempt-signal accepts. USR1 is allowed but not the default: NCCL has used it.
PREEMPT_SIGNALS = ("USR2", "USR1", "TERM", "INT", "HUP")
# The smallest image side the models' pooling takes (--image-size 0 is the dataset's own).
MIN_IMAGE_SIZE = 8
MAX_SEED = 2**32 - 1  # what numpy's and most generators' seeds hold
TIMEOUT = dict(metavar="SECONDS", bounds=Range(0.0, WEEK, low_open=True), resumable=True)


def setting(default, help: str, *, key: str = "", flag: str = "", choices: tuple = (),
            metavar: str = "", bounds: Range | None = None, example: str = "",
            one_shot: bool = False, resumable: bool = False, factory=None):
    """A config field: its default, the help line of its flag, and how the flag looks.
    `key` is its name in the flat mapping when the field's own name would be ambiguous
    (`model.name` is `model`); the flag is `--` + the key in kebab case unless given.
    `bounds`: the Range a number must be in, held by validate, --config files and
    model.json alike; `example`: the value a refusal suggests (default: the default).
    `one_shot`: an action of this invocation (delete, download), not a setting of the
    run: never recorded in config.json, and not taken from a --config file
    (docs/checkpoints.md). `resumable`: a run resumed from a checkpoint may change it
    (where things are, how long to train, how to checkpoint and report); a difference in
    any other setting means the checkpoint is another run's."""
    metadata = dict(help=help, key=key, flag=flag, choices=choices, metavar=metavar,
                    bounds=bounds, example=example, one_shot=one_shot, resumable=resumable)
    if factory is not None:
        return field(default_factory=factory, metadata=metadata)
    return field(default=default, metadata=metadata)


@dataclass
class Model:
    """model"""
    name: str = setting("wrn", "network: wrn (the reference Wide ResNet of the Olivia guide) "
                               "or any torchvision classification model (resnet50, "
                               "efficientnet_b0, convnext_tiny, vit_b_16, ...), its head sized "
                               "to the dataset's classes", key="model", metavar="NAME")
    stem: str = setting("auto", "ResNet family: imagenet (7x7 stride 2 + max-pool) or small "
                                "(3x3 stride 1, no max-pool); auto = imagenet for images of "
                                "64 px and more, small below (printed, kept in config.json)",
                        choices=STEMS)
    init_from: str = setting("", "start from the weights in this .safetensors file (every "
                                 "tensor must match; see docs/your-data.md)", metavar="FILE",
                             resumable=True)
    init_reinit_head: bool = setting(False, "with --init-from: start the classifier head "
                                            "afresh when its size differs (other classes)",
                                     resumable=True)
    width: int = setting(160, "wrn: width of the first stage; the next two are 2x and 4x",
                         bounds=Range(1, 1024))
    blocks_per_stage: int = setting(2, "wrn: residual blocks per stage (the reference's 2)",
                                    bounds=Range(1, 100))
    dropout: float = setting(0.01, "wrn: dropout between the two convolutions of a block",
                             bounds=Range(0.0, 0.99))


@dataclass
class Data:
    """data"""
    dataset: str = setting("cifar100", "dataset", choices=DATASETS)
    data_dir: str = setting("data", "dataset folder (cifar100: the folder holding "
                                    "cifar-100-python/; imagefolder: the one holding train/ "
                                    "and val/; shards: the one holding manifest.json)",
                        resumable=True)
    download: bool = setting(False, "fetch CIFAR-100 first (needs internet; compute nodes "
                                    "rarely have it)", one_shot=True)
    image_size: int = setting(0, "image side; 0 = the dataset's own (32, or 224 for "
                                 "imagefolder and shards)", bounds=Range(0, 2048))
    synthetic_size: int = setting(10_000, "synthetic: training images (the test split gets "
                                          "a fifth of that)", bounds=Range(low=1))
    num_classes: int = setting(100, "synthetic: classes (the other datasets know their own)",
                               bounds=Range(1, 100_000))
    workers: int = setting(-1, "DataLoader processes / DALI threads; -1 = from "
                               "SLURM_CPUS_PER_TASK or the CPUs this process may use",
                       bounds=Range(low=-1), resumable=True)
    stage_to: str = setting("", "copy --data-dir (a folder, or an image folder packed as "
                                "a .tar) to this node-local folder once per node, e.g. "
                                "$SLURM_TMPDIR, verify it and train from there; a complete "
                                "earlier staging is reused", metavar="DIR", resumable=True)
    prepare_data: bool = setting(False, "only prepare the data (--download, --stage-to) and "
                                        "check it can be read, then exit without training",
                                 one_shot=True)
    shards: str = setting("", "with --prepare-data and --dataset imagefolder: pack --data-dir "
                              "into tar shards of about 1,000 images in this folder (train "
                              "from them with --dataset shards --data-dir DIR)", metavar="DIR",
                          one_shot=True)
    shard_size: int = setting(1000, "with --shards: images per shard",
                              bounds=Range(1, 1_000_000), one_shot=True)
    data_backend: str = setting("auto", "auto: device for in-memory sets, dali for image "
                                        "folders on a GPU, else torch (the reason is printed)",
                                choices=DATA_BACKENDS)


@dataclass
class Training:
    """training (the first five as in the reference train.py)"""
    batch_size: int = setting(256, "images per optimizer step on each process",
                              bounds=Range(low=1))
    epochs: int = setting(100, "passes over the training set", bounds=Range(low=1),
                          resumable=True)
    base_lr: float = setting(0.01, "peak learning rate, reached after the warm-up",
                             bounds=Range(0.0, 1000.0, low_open=True))
    target_accuracy: float = setting(0.95, "stop early when `patience` consecutive epochs "
                                           "reach this test accuracy",
                                     bounds=Range(0.0, 1.0, low_open=True),
                                     example="0.95 for 95 %", resumable=True)
    patience: int = setting(2, "epochs at the target accuracy before stopping",
                            bounds=Range(low=1), resumable=True)
    max_steps: int = setting(0, "stop after N optimizer steps in all; 0 = no limit",
                             bounds=Range(low=0), resumable=True)
    momentum: float = setting(0.9, "SGD momentum", bounds=Range(0.0, 1.0, high_open=True))
    weight_decay: float = setting(5e-4, "SGD weight decay", bounds=Range(0.0, 1.0))
    warmup_epochs: float = setting(1.0, "linear warm-up from 0 to base lr over this many "
                                        "epochs, then cosine decay to 0",
                                   bounds=Range(0.0, 1e6))
    label_smoothing: float = setting(0.0, "cross-entropy label smoothing; 0 = off",
                                     bounds=Range(0.0, 1.0, high_open=True))
    seed: int = setting(0, "seeds model init, data order and augmentation: same seed, same "
                           "result on the CPU", bounds=Range(0, MAX_SEED))
    allow_nonfinite_loss: bool = setting(False, "keep training when the training loss becomes "
                                                "NaN or infinite (by default the run stops)",
                                         resumable=True)


@dataclass
class Hardware:
    """hardware"""
    device: str = setting("auto", "auto takes CUDA when a GPU is visible, else the CPU",
                          choices=DEVICES, resumable=True)
    precision: str = setting("auto", "fp32, tf32, bf16 or fp16 autocast; auto = bf16 on GPUs "
                                     "that support it, fp32 elsewhere", choices=PRECISIONS)
    channels_last: bool = setting(False, "NHWC memory format (on by default with CUDA, off "
                                         "on the CPU)")
    compile: bool = setting(False, "torch.compile the model; compile time is reported apart",
                            resumable=True)
    compile_mode: str = setting("default", "with --compile: torch.compile's mode "
                                "(reduce-overhead adds CUDA graphs)", choices=COMPILE_MODES,
                                resumable=True)
    compile_scope: str = setting("model", "with --compile: the whole model, each residual "
                                          "block on its own (blocks: wrn and the ResNets), or "
                                          "the whole step (the model, its loss and the "
                                          "optimizer step)",
                                 choices=COMPILE_SCOPES, resumable=True)
    # Off by default on the H200's figures (docs/performance.md#h200-2026-11-29): the timing
    # cost 2.5 s of a warm start and 13.7 s of a cold one, and the reference workload ran
    # no faster for it.
    cudnn_benchmark: bool = setting(False, "cuDNN benchmark mode on CUDA: time the "
                                           "convolution algorithms before the first step",
                                    resumable=True)
    cudnn_benchmark_limit: int = setting(10, "algorithms cuDNN tries per convolution in "
                                             "benchmark mode; 0 = every one",
                                         bounds=Range(0, 10_000), resumable=True)


@dataclass
class Distributed:
    """several processes (see docs/cluster.md)"""
    strategy: str = setting("ddp", "ddp: a full replica per process; fsdp: FSDP2 shards "
                                   "parameters, gradients and optimizer state",
                            choices=STRATEGIES)
    lr_scaling: str = setting("none", "linear: base lr x number of processes; none: as given",
                              choices=LR_SCALINGS)
    dist_start_timeout_s: float = setting(1800.0, "seconds a rank may wait in a collective "
                                          "until the first step is done (start-up, staging, "
                                          "compile)", flag="--dist-start-timeout", **TIMEOUT)
    dist_timeout_s: float = setting(600.0, "the same after the first step (switched after a "
                                    "barrier)", flag="--dist-timeout", **TIMEOUT)
    stall_timeout_s: float = setting(300.0, "no step done for this long (or 10 median steps): "
                                     "each rank dumps its stacks into <output-dir>/diagnostics;"
                                     " 0 = off", flag="--stall-timeout", metavar="SECONDS",
                                     bounds=Range(0.0, WEEK), example="600", resumable=True)


@dataclass
class Checkpoint:
    """checkpoints, resume and preemption"""
    resume: str = setting("auto", "auto: continue from the newest good checkpoint in the "
                                  "output dir; never: start afresh; or a checkpoint folder",
                          metavar="auto|never|PATH", one_shot=True)
    overwrite: bool = setting(False, "with --resume never: replace the output dir's "
                                     "checkpoints and records", one_shot=True)
    checkpoint_every: Every = setting(None, "also save every N steps or every 10m / 90s / 1h; "
                                            "0 = epoch ends only (each one always saves)",
                                      metavar="N|DURATION", factory=lambda: Every(0, 1800.0),
                                      resumable=True)
    keep_checkpoints: int = setting(3, "complete checkpoints kept; older ones are pruned "
                                       "only after a new one is complete", bounds=Range(low=1),
                                       resumable=True)
    checkpoint_async: bool = setting(True, "save in the background: training waits only "
                                           "while the state is copied to host memory, a "
                                           "writer process commits it (FSDP saves stay "
                                           "synchronous)", resumable=True)
    checkpoint_local: str = setting("", "write each checkpoint to this node-local folder "
                                        "first (e.g. $SLURM_TMPDIR), then copy it into the "
                                        "run folder; a resume takes the newer of the two",
                                    metavar="DIR", resumable=True)
    preempt_signal: str = setting("USR2", "signal that asks for a checkpoint and the requeue "
                                          "exit status 75 (SIGTERM always does)",
                                  choices=PREEMPT_SIGNALS, resumable=True)


@dataclass
class Logging:
    """output"""
    output_dir: str = setting(None, "run folder: config.json, metrics.jsonl, summary.json, "
                                    "checkpoints/ (default: runs/<timestamp>)",
                              factory=lambda: time.strftime("runs/%Y%m%d-%H%M%S"),
                              resumable=True)
    tensorboard: bool = setting(False, "also write TensorBoard event files into "
                                       "<output-dir>/tensorboard")
    log_every: int = setting(0, "a progress line (loss, img/s, ETA, GPU memory) every N "
                                "steps, also in <output-dir>/steps.jsonl; 0 = about every "
                                "30 s when stdout is not a terminal (a terminal shows a bar)",
                             metavar="N", bounds=Range(low=0), resumable=True)
    wandb: bool = setting(False, "also log the metrics to Weights & Biases (the wandb extra; "
                                 "offline unless WANDB_MODE says otherwise)", resumable=True)


SECTIONS = dict(model=Model, data=Data, training=Training, hardware=Hardware,
                distributed=Distributed, checkpoint=Checkpoint, logging=Logging)


@dataclass
class TrainConfig:
    """Everything a `train` run is told, by concern."""
    model: Model = field(default_factory=Model)
    data: Data = field(default_factory=Data)
    training: Training = field(default_factory=Training)
    hardware: Hardware = field(default_factory=Hardware)
    distributed: Distributed = field(default_factory=Distributed)
    checkpoint: Checkpoint = field(default_factory=Checkpoint)
    logging: Logging = field(default_factory=Logging)
    recipe: str = ""  # the tuned recipe that filled the flags the user left out, if any

    @classmethod
    def from_flat(cls, values: dict) -> "TrainConfig":
        """From `key -> value` (config.json's shape); an unknown key is a KeyError."""
        return cls().replace(**values)

    def to_dict(self) -> dict:
        """Flat and JSON-ready: config.json's keys are the flags' names with underscores."""
        flat = {key: getattr(getattr(self, section), name)
                for key, (section, name) in KEYS.items()}
        flat = {k: str(v) if isinstance(v, Every) else v for k, v in flat.items()}
        return dict(flat, recipe=self.recipe)

    def recorded(self) -> dict:
        """config.json: the flat form without this invocation's one-shot actions, so
        `train --config A/config.json` repeats the run, not A's --overwrite."""
        return {k: v for k, v in self.to_dict().items() if k not in ONE_SHOT}

    def replace(self, **values) -> "TrainConfig":
        """A copy with some fields changed, named by their flat keys (`batch_size=64`)."""
        unknown = set(values) - set(KEYS) - {"recipe"}
        if unknown:
            raise KeyError(", ".join(sorted(unknown)))
        changed = {}
        for section in SECTIONS:
            mine = {KEYS[k][1]: _coerce(k, v) for k, v in values.items()
                    if k in KEYS and KEYS[k][0] == section}
            changed[section] = dataclasses.replace(getattr(self, section), **mine)
        return dataclasses.replace(self, **changed, recipe=values.get("recipe", self.recipe))


def key_of(f: dataclasses.Field) -> str:
    return f.metadata["key"] or f.name


# flat key -> (section, field name), in the order of the sections and their fields.
KEYS = {key_of(f): (section, f.name) for section, cls in SECTIONS.items()
        for f in dataclasses.fields(cls)}
FIELDS = {key_of(f): f for cls in SECTIONS.values() for f in dataclasses.fields(cls)}
# The one-shot actions (--overwrite, --resume, --download, --prepare-data, --shards and its
# --shard-size), in field order.
ONE_SHOT = tuple(key for key, f in FIELDS.items() if f.metadata["one_shot"])
# What a resumed run may set otherwise than its checkpoint's config: the resumable fields,
# the one-shot actions (no settings of the run) and the recipe's name (the values it filled
# are compared one by one).
MAY_CHANGE_ON_RESUME = frozenset(
    {key for key, f in FIELDS.items() if f.metadata["resumable"] or f.metadata["one_shot"]}
    | {"recipe"})


def _coerce(key: str, value):
    """Text from a file or a flag into the field's typed value (`"10m"` -> Every)."""
    return Every.parse(value) if FIELDS[key].type is Every else value


def out_of_bounds(key: str, value) -> str:
    """Why `value` is outside the Range of the field `key` ("" when inside, or unbounded):
    the one range train's flags, --config files and model.json are held to."""
    bounds = FIELDS[key].metadata["bounds"]
    problem = bounds.problem(value) if bounds else ""
    return f"must be {problem}, got {value!r}" if problem else ""


def example_of(key: str) -> str:
    """The value a refusal of `key` suggests: the field's example, else its default."""
    f = FIELDS[key]
    return f.metadata["example"] or str(f.default if f.default is not dataclasses.MISSING
                                        else f.default_factory())


def flag_of(key: str) -> str:
    """The command-line flag of a field, for messages: `batch_size` -> `--batch-size`."""
    return FIELDS[key].metadata["flag"] or "--" + key.replace("_", "-")
