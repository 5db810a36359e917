"""File helpers every layer uses: the writable-folder check, JSON written atomically,
JSON lines, sha256. Standard library only."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path


def unwritable_reason(path: str | Path, create: bool = False) -> str | None:
    """None when a file can be created in `path`, else why.

    `create` makes the folder (and its parents) first; without it the nearest existing
    parent is tested. A real file is created and removed: os.access() says yes on read-only
    bind mounts.
    """
    folder = Path(path).expanduser().absolute()
    try:
        if create:
            folder.mkdir(parents=True, exist_ok=True)
        while not folder.exists() and folder != folder.parent:
            folder = folder.parent
        if not folder.is_dir():
            return f"{folder} is not a folder"
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".write-test-"):
            return None
    except OSError as error:
        return f"{folder}: {error.strerror}"


def write_json(path: Path, data: dict) -> None:
    """Write through a temporary file and rename, so readers never see half a file."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)


def append_jsonl(path: Path, record: dict) -> None:
    with open(path, "a") as f:
        f.write(json.dumps(record, sort_keys=True) + "\n")


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
