"""How the command-line tools report bad input (workload.usage.UsageError, re-exported
here under the name its callers import) and the write failures a user must fix."""

import errno
import os
import sys
import time

from workload.held import named_for_the_user
from workload.logs import say
from workload.usage import UsageError  # noqa: F401 - its callers' name for it

# Exit status for bad input, the same as argparse uses for a bad flag.
USAGE_EXIT_STATUS = 2


def exit_with_usage_error(prog: str, error: Exception) -> None:
    """Print one line on stderr and exit with the usage status, before any work starts."""
    say(f"{prog}: error: {error}", sys.stderr)
    sys.exit(USAGE_EXIT_STATUS)


# A write that failed for a reason the user must fix, not the program: what went wrong (the
# file or folder follows) and the fix. Every command reports these in one line
# (workload.commands.run_command), whichever file it was writing.
_NO_SPACE = ("no space left on the device holding", "free space there")
WRITE_PROBLEMS = {errno.ENOSPC: _NO_SPACE, errno.EDQUOT: _NO_SPACE,
                  errno.EROFS: ("the file system turned read-only under",
                                "make it writable again (a file system error or a remount "
                                "made it read-only: ask your site's support) or copy the run "
                                "folder to another and pass that as --output-dir"),
                  errno.EIO: ("an input/output error on the device holding",
                              "ask your site's support (a failing disk or file system) or "
                              "pass an --output-dir on another")}


def write_problem(number: int | None, where) -> str | None:
    """The one line for a write at `where` that failed with errno `number`, when the user
    must fix it (WRITE_PROBLEMS); None for another failure."""
    if number == errno.EIO and _turns_read_only(where):
        number = errno.EROFS
    if number not in WRITE_PROBLEMS:
        return None
    problem, fix = WRITE_PROBLEMS[number]
    return f"{problem} {named_for_the_user(str(where))} ({os.strerror(number)}); {fix}"


# ext4 turned read-only by an error (errors=remount-ro) aborts its journal first, which
# fails the writes then in flight with EIO, and refuses writes a moment later (EROFS from
# then on; since Linux 6.x without marking the mount read-only in statvfs): an EIO is the
# read-only file system when its folder refuses a write within this.
READ_ONLY_MARK_S = 2.0


def _turns_read_only(where) -> bool:
    """Whether the file system holding `where` (its nearest folder that exists) refuses
    writes as read-only now or within READ_ONLY_MARK_S."""
    path = os.path.abspath(str(where))
    while not os.path.isdir(path) and path != os.path.dirname(path):
        path = os.path.dirname(path)
    deadline = time.monotonic() + READ_ONLY_MARK_S
    while (refused := _refuses_writes(path)) is False and time.monotonic() < deadline:
        time.sleep(0.05)
    return bool(refused)


def _refuses_writes(folder: str) -> bool | None:
    """True when `folder`'s file system is read-only (its mount, or an unnamed file made
    there, O_TMPFILE, refused with EROFS: nothing is left behind); False when writable;
    None when it cannot tell."""
    try:
        if os.statvfs(folder).f_flag & os.ST_RDONLY:
            return True
        os.close(os.open(folder, os.O_TMPFILE | os.O_WRONLY | os.O_CLOEXEC, 0o600))
    except OSError as error:
        return True if error.errno == errno.EROFS else None
    return False


def failed_write_line(error: OSError) -> str | None:
    """write_problem's line for a command's failed write (the file it names), or None."""
    return write_problem(error.errno, error.filename or "a file it was writing")


class LaunchError(ValueError):
    """A launch variable that cannot be used; ``str()`` is one line for stderr."""

    def __init__(self, name: str, value: str, expected: str, fix: str):
        self.name = name
        self.value = value
        super().__init__(f"{name}={_quoted(value)} is not usable: expected {expected}; "
                         f"fix: {fix}")


def _quoted(value: str, limit: int = 80) -> str:
    """The value quoted for a one-line message; a long one by its start and its length."""
    if len(value) <= limit:
        return repr(value)
    return f"{value[:limit // 2]!r}... ({len(value)} characters)"
