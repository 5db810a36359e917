"""The error for bad input: a user's value, a launch variable or the place a command runs
in (/proc not mounted). The ground floor, standard library only, so that every module may
raise it, workload.held's included; workload.errors says how the commands report it."""


class UsageError(Exception):
    """Bad input from the user: the message names the value, what was expected and the fix."""
