"""`train` in processes forked from a server that imported torch and the package once
(multiprocessing's forkserver): each run is its own process, with its own PID, signal
handlers and background checkpoint writer, running the console script's own `cli()`,
without the seconds a fresh interpreter spends importing torch on a loaded 2-core
machine (tests/e2e/test_checkpoint_async_kills.py starts 20 runs and kills them)."""

from __future__ import annotations

import multiprocessing
import os
import sys
from pathlib import Path

PRELOAD = ["torch", "torchvision", "workload.train", "workload.training.run",
           "workload.checkpoint.policy", "workload.checkpoint.session"]


def _train(argv: list[str], log: str) -> None:
    """The child: stdout and stderr into `log`, then train as `train ARGV` does."""
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    sys.stdout = open(1, "w", buffering=1, closefd=False)
    sys.stderr = open(2, "w", buffering=1, closefd=False)
    from workload.train import cli

    sys.argv = ["train", *argv]
    cli()  # ends the process with train's exit status


def start_train(argv: list[str], log: Path) -> multiprocessing.Process:
    """A started `train ARGV` writing its output to `log` (its exitcode after join():
    the exit status, or minus the signal that killed it)."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(PRELOAD)
    process = context.Process(target=_train, args=(argv, str(log)), daemon=False)
    process.start()
    return process
