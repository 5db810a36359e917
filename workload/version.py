"""`--version`: the package version (and, in the image, what it runs on)."""

from __future__ import annotations

from workload import __version__


def version_text() -> str:
    return f"hpc-train {__version__}"
