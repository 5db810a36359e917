"""An Apptainer definition file as Apptainer builds it: its build arguments filled in.

Apptainer 1.2 and later (internal/pkg/build/args) replace each `{{ NAME }}` outside a
comment line with the value given by `--build-arg NAME=VALUE`, else the default in the
file's %arguments section; a name given neither way is an error. apptainer/*.def use it
for the base (`Bootstrap: {{ BOOTSTRAP }}`, `From: {{ BASE }}`).
"""

from __future__ import annotations

import re
from pathlib import Path

BUILD_ARG = re.compile(r"{{\s*(\w+)\s*}}")


def defaults(text: str) -> dict[str, str]:
    """The %arguments section's NAME=VALUE lines."""
    if "\n%arguments\n" not in text:
        return {}
    section = text.split("\n%arguments\n", 1)[1].split("\n%", 1)[0]
    rows = (line.strip() for line in section.splitlines())
    return dict(tuple(part.strip() for part in row.split("=", 1))
                for row in rows if "=" in row and not row.startswith("#"))


def rendered(path: Path, build_args: dict[str, str] | None = None) -> str:
    """The definition's text with its build arguments filled in; KeyError names one that
    is neither given nor defaulted (Apptainer: "build var NAME is not defined")."""
    text = path.read_text()
    values = defaults(text) | (build_args or {})

    def fill(line: str) -> str:
        if line.lstrip().startswith("#"):
            return line
        return BUILD_ARG.sub(lambda found: values[found.group(1)], line)
    return "".join(fill(line) for line in text.splitlines(keepends=True))


def header(text: str) -> dict[str, str]:
    """The header's keywords (bootstrap, from, ...), lower-cased, up to the first section."""
    found = {}
    for line in text.split("\n%", 1)[0].splitlines():
        key, colon, value = line.split("#", 1)[0].partition(":")
        if colon and key.strip():
            found[key.strip().lower()] = value.strip()
    return found
