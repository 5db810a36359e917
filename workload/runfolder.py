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

Standard library only: the torch-free commands (diagnose, evaluate's checks, report)
import it as well as train.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

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


@dataclass(frozen=True)
class RunFolder:
    """The files of the run folder `root`, as given (a relative --output-dir stays
    relative in what is logged)."""
    root: Path

    @classmethod
    def of(cls, output_dir) -> RunFolder:
        """The run folder of --output-dir (or a RUN_DIR), `~` expanded."""
        return cls(Path(output_dir).expanduser())

    @property
    def config(self) -> Path:
        return self.root / CONFIG

    @property
    def metrics(self) -> Path:
        return self.root / METRICS

    @property
    def steps(self) -> Path:
        return self.root / STEPS

    @property
    def summary(self) -> Path:
        return self.root / SUMMARY

    @property
    def model(self) -> Path:
        return self.root / MODEL_JSON

    @property
    def weights(self) -> Path:
        return self.root / WEIGHTS

    @property
    def checkpoints(self) -> Path:
        return self.root / CHECKPOINTS

    @property
    def diagnostics(self) -> Path:
        """Absolute: the flight recorder's variables name it, read where torch writes."""
        return self.root.absolute() / DIAGNOSTICS

    @property
    def lock(self) -> Path:
        return self.root / LOCK

    @property
    def attempts(self) -> Path:
        return self.root / ATTEMPTS

    @property
    def bad_nodes(self) -> Path:
        return self.root / BAD_NODES

    @property
    def records(self) -> tuple[Path, Path, Path]:
        """The records a run appends to or ends with (what --overwrite removes with its
        checkpoints)."""
        return self.metrics, self.steps, self.summary
