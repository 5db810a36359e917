"""One logger with a short prefix; only rank 0 speaks unless something is wrong."""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Callable, Iterator
from typing import TextIO

from workload.held import named_for_the_user

logger = logging.getLogger("workload")


def say(line: str, stream: TextIO | None = None) -> None:
    """Write `line` and its newline in one call. With PYTHONUNBUFFERED (the image sets it)
    print() writes the text and the newline separately, and the lines of ranks that share a
    node's output (torchrun's workers, srun's tasks) interleave mid-line."""
    stream = sys.stdout if stream is None else stream
    stream.write(named_for_the_user(line) + "\n")
    stream.flush()


def warn(source: str, message: str) -> None:
    """`source: warning: message` on stderr, as one line, from whichever rank has it."""
    say(f"{source}: warning: {message}", sys.stderr)


class UsersNames(logging.Formatter):
    """A record's line with the user's names of held folders (held.named_for_the_user)."""

    def format(self, record: logging.LogRecord) -> str:
        return named_for_the_user(super().format(record))


def setup_logging(rank: int = 0) -> logging.Logger:
    """Rank 0 logs at INFO; other ranks only warnings and errors, prefixed with their rank."""
    prefix = "train" if rank == 0 else f"train[rank {rank}]"
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(UsersNames(f"{prefix}: %(message)s"))
    logger.handlers[:] = [handler]
    logger.setLevel(logging.INFO if rank == 0 else logging.WARNING)
    logger.propagate = False
    return logger


@contextlib.contextmanager
def logging_kept():
    """The logger's handlers, level and propagation put back afterwards: setup_logging's
    handler writes to the stdout of its time, which a program that called a command in
    its own process may since have closed or replaced."""
    saved = (logger.handlers[:], logger.level, logger.propagate)
    try:
        yield
    finally:
        logger.handlers[:], logger.level, logger.propagate = saved


class _Rewritten(logging.Filter):
    def __init__(self, rewrite: Callable[[str], str]):
        super().__init__()
        self.rewrite = rewrite

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg = self.rewrite(record.getMessage())
        record.args = None  # the message is whole now
        return True


@contextlib.contextmanager
def messages_rewritten(rewrite: Callable[[str], str]) -> Iterator[None]:
    """Every log line and the message of an exception that leaves the block passed
    through `rewrite` (train's run folder named as the user gave it, not by the held
    path its files are reached through: workload.runfolder.RunFolder.said)."""
    rewritten = _Rewritten(rewrite)
    logger.addFilter(rewritten)
    try:
        yield
    except Exception as error:  # its type kept: a UsageError's subclass sets the status
        if error.args and isinstance(error.args[0], str):
            error.args = (rewrite(error.args[0]), *error.args[1:])
        if isinstance(error, OSError) and isinstance(error.filename, str):
            error.filename = rewrite(error.filename)  # named once the folder is let go
        raise
    finally:
        logger.removeFilter(rewritten)


class Progress:
    """A one-line progress indicator, drawn only when stdout is a terminal (never in batch
    logs). It shows steps, not the loss, so it never forces a device synchronisation."""

    def __init__(self, total: int, label: str, enabled: bool):
        self.total = total
        self.label = label
        self.enabled = enabled and sys.stdout.isatty()

    def update(self, step: int) -> None:
        if self.enabled and (step % 10 == 0 or step == self.total):
            print(f"\r{self.label} {step}/{self.total}", end="", flush=True)

    def close(self) -> None:
        if self.enabled:
            print("\r\033[K", end="", flush=True)


def shown(value, limit: int = 60) -> str:
    """`value` (a name or number read from a file) as it can go into one log line: its repr,
    cut at `limit` characters, in ASCII (a NUL, a newline or a lone surrogate escaped: a
    lone surrogate would make the log stream raise)."""
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001 (a user's object whose __repr__ fails: named by its type)
        text = f"<a {type(value).__name__} whose repr() fails>"
    text = text[:limit] + ("..." if len(text) > limit else "")
    return text.encode("ascii", "backslashreplace").decode()
