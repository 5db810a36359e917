"""The twin's configuration (TWIN_CONFIG) and the node a stand-in runs on: a compute
node where SLURM_JOB_ID is set, the login node everywhere else."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def fail(message: str, status: int = 1):
    sys.stderr.write(message + "\n")
    sys.exit(status)


CONFIG = json.loads(Path(os.environ["TWIN_CONFIG"]).read_text())


def on_compute() -> bool:
    return bool(os.environ.get("SLURM_JOB_ID"))


def node_arch() -> str:
    return CONFIG["compute"]["arch"] if on_compute() else CONFIG["login"]["arch"]


def site_path(path: str) -> Path:
    """A path as the page writes it, on the twin: under a site root, it is below the
    twin's root folder."""
    for root in CONFIG["roots"]:
        if path == root or path.startswith(root + "/"):
            return Path(CONFIG["root_dir"] + path)
    return Path(path)
