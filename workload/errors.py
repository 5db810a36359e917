"""The one exception type for bad input, and how the command-line tools report it."""

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
