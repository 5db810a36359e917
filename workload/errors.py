"""The error types for bad input (a user's value, a launch variable), and how the
command-line tools report them."""

import sys

from workload.logs import say

# Exit status for bad input, the same as argparse uses for a bad flag.
USAGE_EXIT_STATUS = 2


class UsageError(Exception):
    """Bad input from the user: the message names the value, what was expected and the fix."""


def exit_with_usage_error(prog: str, error: Exception) -> None:
    """Print one line on stderr and exit with the usage status, before any work starts."""
    say(f"{prog}: error: {error}", sys.stderr)
    sys.exit(USAGE_EXIT_STATUS)


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
