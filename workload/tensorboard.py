"""`train --tensorboard`: the per-epoch metrics as TensorBoard event files.

Rank 0 writes them into <output-dir>/tensorboard; view them with
    tensorboard --logdir runs/        (or: report RUN_DIR for PNG figures)
"""

from __future__ import annotations

import contextlib
import importlib.util
from pathlib import Path

from workload.errors import UsageError

# metrics.jsonl field -> TensorBoard tag
TAGS = {"train_loss": "loss/train", "test_loss": "loss/test", "accuracy": "accuracy/test",
        "images_per_second": "throughput/images_per_second", "lr": "lr",
        "epoch_time_s": "time/epoch_s"}


def require_tensorboard() -> None:
    """Fail before any work when --tensorboard is asked for but cannot write."""
    if importlib.util.find_spec("tensorboard") is None:
        raise UsageError("--tensorboard needs the tensorboard package, which is not "
                         "installed; pip install matplotlib tensorboard or leave out --tensorboard")


class Board:
    """One SummaryWriter; `log_epoch` takes the same record that goes to metrics.jsonl."""

    def __init__(self, out: Path):
        from torch.utils.tensorboard import SummaryWriter
        self.writer = SummaryWriter(log_dir=str(out / "tensorboard"))

    def log_epoch(self, record: dict) -> None:
        for key, tag in TAGS.items():
            if record.get(key) is not None:
                self.writer.add_scalar(tag, record[key], global_step=record["epoch"])
        self.writer.flush()  # a job killed at its time limit keeps every finished epoch

    def close(self) -> None:
        self.writer.close()


class NoBoard:
    def log_epoch(self, record: dict) -> None:
        pass

    def close(self) -> None:
        pass


@contextlib.contextmanager
def open_board(enabled: bool, out: Path):
    board = Board(out) if enabled else NoBoard()
    try:
        yield board
    finally:
        board.close()
