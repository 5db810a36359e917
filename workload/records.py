"""What a run leaves behind in the output directory: config.json, metrics.jsonl,
summary.json (the folder's check, the model's sha256, the versions), and the metrics for
TensorBoard and Weights & Biases.

`train --tensorboard`: the per-epoch metrics as TensorBoard event files; `train --wandb`:
the same metrics, under the same names, to Weights & Biases.

Rank 0 writes them into <output-dir>/tensorboard; view them with
    tensorboard --logdir runs/        (or: report RUN_DIR for PNG figures)
W&B runs offline unless WANDB_MODE is set (compute nodes rarely reach the internet): the
run lands in <output-dir>/wandb/wandb/ (W&B makes its own wandb/ in the folder it is
given); upload it from a login node with
    wandb sync <output-dir>/wandb/wandb/offline-run-*
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from pathlib import Path

import torch
import torch.nn as nn

from workload.commands import DISTRIBUTION, dali_versions, distribution_version
from workload.distributed import unwrap
from workload.errors import UsageError
from workload.files import umask_mode, unwritable_reason
from workload.held import held_path, hold_own_folder, let_go
from workload.runfolder import RunFolder


def prepare_output_dir(folder: RunFolder, path: str) -> RunFolder:
    """Create the output directory (`path`, as --output-dir gave it) and prove it is
    writable, or fail before any training: the run folder, held (RunFolder.hold)."""
    problem = unwritable_reason(folder.root, create=True)
    if problem:
        raise UsageError(f"--output-dir {path} is not a writable directory ({problem}); "
                         "pass a folder you can write to, e.g. --output-dir $SCRATCH/runs/x")
    return folder.hold()


def model_sha256(model: nn.Module) -> str:
    """sha256 over every parameter and buffer, by name in state-dict order.

    Two runs that end with bit-identical weights have the same digest, whatever wrapper
    (DDP, torch.compile) the model ran under.
    """
    digest = hashlib.sha256()
    for name, tensor in unwrap(model).state_dict().items():
        if hasattr(tensor, "full_tensor"):  # FSDP2 shard: gather the whole tensor
            tensor = tensor.full_tensor()
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def versions() -> dict:
    """Versions of what the numbers depend on; torchvision's and DALI's read from their
    installed metadata, as `--version` reads them, without importing them (torchvision's
    import takes seconds)."""
    found = {
        "torch": torch.__version__,
        "torchvision": distribution_version("torchvision"),
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.cuda.is_available() else None,
        "dali": dali_versions()[0],
        "workload": distribution_version(DISTRIBUTION),
    }
    return {k: v for k, v in found.items() if v is not None}


# metrics.jsonl field -> TensorBoard tag
TAGS = {"train_loss": "loss/train", "test_loss": "loss/test", "accuracy": "accuracy/test",
        "images_per_second": "throughput/images_per_second", "lr": "lr",
        "epoch_time_s": "time/epoch_s"}


def board_folder(folder: Path, flag: str) -> str:
    """`folder`, which a library writes into by its own paths (following links, at names
    it chooses): the user's own, not a link, and writable by no one else (readable as the
    umask lets the group), so no one sharing the run folder can put a link or a file in
    it for the library to write through; one line otherwise. What the library gets is its
    held path (workload.held.hold_own_folder): the run folder may be written by others,
    who could rename the folder once checked and put theirs at its name, and the library
    would follow that name."""
    try:  # held until the board closes: the library writes until the run ends
        return str(held_path(hold_own_folder(folder, umask_mode(0o777) & ~0o022)))
    except OSError as error:
        raise UsageError(f"{flag}: {error.strerror or error}; move it away, or pass another "
                         "--output-dir") from None


class Board:
    """One SummaryWriter; `log_epoch` takes the same record that goes to metrics.jsonl."""

    def __init__(self, run: RunFolder):
        from torch.utils.tensorboard import SummaryWriter
        self.folder = board_folder(run.tensorboard, "--tensorboard")
        self.writer = SummaryWriter(log_dir=self.folder)

    def log_epoch(self, record: dict) -> None:
        for key, tag in TAGS.items():
            if record.get(key) is not None:
                self.writer.add_scalar(tag, record[key], global_step=record["epoch"])
        self.writer.flush()  # a job killed at its time limit keeps every finished epoch

    def close(self) -> None:
        self.writer.close()
        let_go(Path(self.folder))


class WandbBoard:
    """One W&B run (project from WANDB_PROJECT, default hpc-train; named after the run
    folder), logging what TensorBoard gets at the same steps (epochs)."""

    def __init__(self, run: RunFolder, config: dict):
        os.environ.setdefault("WANDB_MODE", "offline")
        self.folder = board_folder(run.wandb, "--wandb")  # wandb makes its wandb/ in it
        import wandb

        self.run = wandb.init(project=os.environ.get("WANDB_PROJECT", "hpc-train"),
                              name=run.root.name, dir=self.folder, config=config)

    def log_epoch(self, record: dict) -> None:
        self.run.log({tag: record[key] for key, tag in TAGS.items()
                      if record.get(key) is not None}, step=record["epoch"])

    def close(self) -> None:
        self.run.finish()
        let_go(Path(self.folder))


class Boards:
    """The boards a run writes to (none, either or both), behind one `log_epoch`."""

    def __init__(self, boards: list):
        self.boards = boards

    def log_epoch(self, record: dict) -> None:
        for board in self.boards:
            board.log_epoch(record)

    def close(self) -> None:
        for board in self.boards:
            board.close()


@contextlib.contextmanager
def open_board(enabled: bool, run: RunFolder, wandb_config: dict | None = None):
    """TensorBoard when `enabled`; W&B too when given the run's config."""
    boards = Boards([Board(run)] if enabled else [])
    try:
        if wandb_config is not None:
            boards.boards.append(WandbBoard(run, wandb_config))
        yield boards
    finally:
        boards.close()
