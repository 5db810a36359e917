"""The one error type of the launch layer: a bad value, named, with its fix."""

from __future__ import annotations


class LaunchError(ValueError):
    """A launch variable that cannot be used; ``str()`` is one line for stderr."""

    def __init__(self, name: str, value: str, expected: str, fix: str):
        self.name, self.value = name, value
        super().__init__(f"{name}={value!r} is not usable: expected {expected}; fix: {fix}")
