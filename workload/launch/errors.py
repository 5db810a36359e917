"""The one error type of the launch layer: a bad value, named, with its fix."""

from __future__ import annotations


class LaunchError(ValueError):
    """A launch variable that cannot be used; ``str()`` is one line for stderr."""

    def __init__(self, name: str, value: str, expected: str, fix: str):
        self.name, self.value = name, value
        super().__init__(f"{name}={shown(value)} is not usable: expected {expected}; "
                         f"fix: {fix}")


def shown(value: str, limit: int = 80) -> str:
    """The value quoted for a one-line message; a long one by its start and its length."""
    if len(value) <= limit:
        return repr(value)
    return f"{value[:limit // 2]!r}... ({len(value)} characters)"
