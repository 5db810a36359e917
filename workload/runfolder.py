"""A run folder (train's --output-dir), every file of it named once: what train writes,
what a resume reads and trims, and what report, diagnose and evaluate read back.

    config.json          the run's settings (TrainConfig.recorded())
    metrics.jsonl        a line per epoch
    steps.jsonl          the progress lines (--log-every)
    summary.json         the run's end
    model.json           the final model's description, and model.safetensors its weights
    checkpoints/         the checkpoints (workload.checkpoint.writer.folder)
    diagnostics/         heartbeats, stacks, the flight recorder, start-up marks
    train.lock           the one writer's lock (workload.checkpoint.lock)
    attempts.jsonl       a line per job step ended: the decision after it, with its
                         progress and reasons (workload.diagnose.attempts)
    bad-nodes.jsonl      the nodes named bad and left behind, and their clearing
    tensorboard/         --tensorboard's folder (the library writes in it by its paths)
    wandb/               --wandb's folder (W&B makes its own wandb/ in it)
    compile-cache-<key>.tar   --compile's kernels for the next job
                         (workload.training.compile_cache; <key>: the versions)

A command builds the record once and passes it. train holds the folder (`hold`): it
sits in a project folder its group may write, so a neighbour could rename it away and
put a link at its name; every file of its own the run writes is then reached through the
descriptor opened at the start (a held path, workload.held), never through that name.
`root` stays the folder as given: what a message names (`said`).

Standard library only: the torch-free commands (diagnose, evaluate's checks, report)
import it as well as train.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, replace
from pathlib import Path

from workload.held import held_path
from workload.launch.diagnostics import DIAGNOSTICS

CONFIG = "config.json"
METRICS = "metrics.jsonl"
STEPS = "steps.jsonl"
SUMMARY = "summary.json"
MODEL_JSON = "model.json"
WEIGHTS = "model.safetensors"
CHECKPOINTS = "checkpoints"
LOCK = "train.lock"
ATTEMPTS = "attempts.jsonl"
BAD_NODES = "bad-nodes.jsonl"
TENSORBOARD = "tensorboard"
WANDB = "wandb"
COMPILE_CACHES = "compile-cache-*.tar"  # compile_cache(key) names one


def _entry(name: str) -> property:
    """The property of the run folder's entry `name`, reached as the folder is."""
    return property(lambda folder: folder.reached / name, doc=f"{name} in the run folder")


@dataclass(frozen=True)
class RunFolder:
    """The files of the run folder `root`, as given (a relative --output-dir stays
    relative in what is logged); once `hold`, reached through `held`."""
    root: Path
    held: Path | None = None

    @classmethod
    def of(cls, output_dir) -> RunFolder:
        """The run folder of --output-dir (or a RUN_DIR), `~` expanded; a RunFolder as it
        is (a caller that passes the record it holds, or one that has a path only)."""
        if isinstance(output_dir, RunFolder):
            return output_dir
        return cls(Path(output_dir).expanduser())

    def hold(self) -> RunFolder:
        """This record, its files reached from now on through a descriptor of the folder
        opened now, until its holder lets it go (held.let_go(record.held)). A link at
        `root` is followed here, once (an --output-dir may be a link the user made to their
        scratch); what anyone renames or puts at its name later is never reached."""
        fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        return replace(self, held=held_path(fd))

    @property
    def reached(self) -> Path:
        """Where its files are reached: the held path once held, else `root`."""
        return self.held or self.root

    config = _entry(CONFIG)
    metrics = _entry(METRICS)
    steps = _entry(STEPS)
    summary = _entry(SUMMARY)
    model = _entry(MODEL_JSON)
    weights = _entry(WEIGHTS)
    tensorboard = _entry(TENSORBOARD)
    wandb = _entry(WANDB)
    checkpoints = _entry(CHECKPOINTS)
    lock = _entry(LOCK)
    attempts = _entry(ATTEMPTS)
    bad_nodes = _entry(BAD_NODES)

    def said(self, text: str) -> str:
        """A message that may name files by the held path, naming them under `root`
        instead (train's messages pass through it: workload.logs.messages_rewritten)."""
        if self.held is None:
            return text
        # Not a longer descriptor's number: /proc/PID/fd/3 is no part of /proc/PID/fd/31
        return re.sub(re.escape(str(self.held)) + r"(?!\d)", lambda _: str(self.root), text)

    def compile_cache(self, key: str) -> Path:
        """The compile cache of the versions `key` names."""
        return self.reached / COMPILE_CACHES.replace("*", key)

    @property
    def compile_caches(self) -> list[Path]:
        """Every compile cache in the folder, of any versions."""
        return sorted(self.reached.glob(COMPILE_CACHES))

    @property
    def diagnostics(self) -> Path:
        """Absolute, by `root`: the flight recorder's variables name it before the folder
        is held, and messages name it (a diagnose command to run); the package's own
        writers reach it as `diagnostics_reached`."""
        return self.root.absolute() / DIAGNOSTICS

    @property
    def diagnostics_reached(self) -> Path:
        """diagnostics/ reached through the held run folder (held on its own by its
        writers: workload.launch.diagnostics.hold_diagnostics)."""
        return self.reached.absolute() / DIAGNOSTICS

    @property
    def records(self) -> tuple[Path, Path, Path]:
        """The records a run appends to or ends with (what --overwrite removes with its
        checkpoints)."""
        return self.metrics, self.steps, self.summary
