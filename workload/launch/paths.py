"""Relative paths that would land inside a container: the pyxis/enroot pitfall.

pyxis (``srun --container-image=...``) starts the task in the image's WORKDIR, not in the
folder the job was submitted from, and the container's root file system is writable and
thrown away at the end of the job. A relative ``--output-dir`` (the default
``runs/<time>``) or ``--data-dir`` (default ``data``) then resolves inside the container:
the run is written, and lost, without an error. Apptainer keeps the submit folder as the
current folder, so there the same paths are fine.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping

from workload.launch.resolve import in_slurm


def outside_submit_dir(paths: Mapping[str, str], env: Mapping[str, str],
                       cwd: str | Path) -> list[str]:
    """A warning, with its fix, for each relative path of `paths` (flag -> value) when
    this SLURM task does not run in the submit folder (SLURM_SUBMIT_DIR)."""
    submit = env.get("SLURM_SUBMIT_DIR")
    if not (in_slurm(env) and submit) or _same(cwd, submit):
        return []
    return [f"{flag} {value} is relative to the current folder {cwd}, not to the folder "
            f"the job was submitted from ({submit}): inside a container started by pyxis "
            f"(which starts in the image's WORKDIR) it is written into the container and "
            f"lost when the job ends; pass an absolute path on a mounted file system "
            f"(e.g. {flag} {Path(submit) / value}) or start the task in the submit folder "
            f"(srun --container-workdir=\"$PWD\" --container-mounts=\"$PWD\")"
            for flag, value in paths.items() if value and not os.path.isabs(value)]


def _same(a: str | Path, b: str | Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:  # the submit folder is not even visible here
        return False
