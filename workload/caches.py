"""Cache folders that every user can write, also on a /tmp shared between users.

The image points the Triton, Inductor, CUDA, DALI (numba), matplotlib and pip caches at
fixed folders under /tmp, because its root filesystem is read-only under Apptainer. But
Apptainer binds the host's /tmp: on a shared node the first user to run creates those
folders and the next one cannot write into them. Such a cache moves to a per-user folder.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from workload.files import unwritable_reason

CACHE_VARIABLES = ("TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "TORCH_EXTENSIONS_DIR",
                   "TORCH_HOME", "CUDA_CACHE_PATH", "NUMBA_CACHE_DIR", "MPLCONFIGDIR",
                   "PIP_CACHE_DIR")


def private_cache_dir(variable: str) -> Path:
    """This user's own folder for one cache: <tmp>/hpc-train-cache-<uid>/<name>."""
    return Path(tempfile.gettempdir()) / f"hpc-train-cache-{os.getuid()}" / variable.lower()


def ensure_writable_caches(env=os.environ) -> dict[str, str]:
    """Point every cache variable whose folder this user cannot write at a private one.

    Returns the variables moved, with their new folders, so the caller can say so.
    """
    moved = {}
    for variable in CACHE_VARIABLES:
        path = env.get(variable)
        if path and unwritable_reason(path, create=True):
            private = private_cache_dir(variable)
            private.mkdir(parents=True, exist_ok=True, mode=0o700)
            env[variable] = moved[variable] = str(private)
    return moved
