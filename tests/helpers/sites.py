"""A site's module system for the job scripts of jobs/sites/, shared by the tests that run
them (tests/e2e/test_sites.py with a stub srun, tests/e2e/test_site_jobs_slurm.py on the
SLURM cluster).

Lmod's `module` is a shell function every batch script inherits; this one is exported the
way Lmod exports its own (BASH_FUNC_module%%). Like Olivia's, it loads nothing at login,
and an `NCCL/...` module is unknown until `NRIS/GPU` is loaded
(https://documentation.sigma2.no/hpc_machines/olivia/nccl.html): then `module load` fails
with Lmod's message and status 1. Loading an NCCL module puts STAND_IN_NCCL on
LD_LIBRARY_PATH; `module -t avail` lists STAND_IN_MODULES on stderr, as Lmod does.
"""

from __future__ import annotations

from pathlib import Path

LMOD_UNKNOWN = "Lmod has detected the following error:  The following module(s) are unknown:"

MODULE = (
    "() { case $1 in "
    "reset) unset STAND_IN_STACK;; "
    "load) case $2 in "
    "NRIS/GPU) export STAND_IN_STACK=NRIS/GPU;; "
    "NCCL/*) if [[ ${STAND_IN_STACK:-} != NRIS/GPU ]]; then "
    f"printf '%s \"%s\"\\n' '{LMOD_UNKNOWN}' \"$2\" >&2; return 1; fi; "
    "export LD_LIBRARY_PATH=$STAND_IN_NCCL${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH};; "
    "esac;; "
    "-t) [[ ${STAND_IN_STACK:-} == NRIS/GPU ]] && printf '%s\\n' $STAND_IN_MODULES >&2; true;; "
    "esac; }")


def stand_in_nccl(folder: Path, version: str) -> Path:
    """An NCCL module's lib folder: libnccl.so.2 -> libnccl.so.X.Y.Z (a stand-in file: the
    check reads versions, and a CPU training step loads no NCCL)."""
    folder.mkdir(parents=True)
    (folder / f"libnccl.so.{version}").write_bytes(b"stand-in")
    (folder / "libnccl.so.2").symlink_to(f"libnccl.so.{version}")
    return folder


def olivia_settings(tmp_path: Path, version: str = "99.0.0") -> dict[str, str]:
    """The module environment of an Olivia job: the stand-in NCCL and the module list."""
    return {"STAND_IN_NCCL": str(stand_in_nccl(tmp_path / f"NCCL-{version}" / "lib", version)),
            "STAND_IN_MODULES": "NCCL/2.26.6-GCCcore-14.2.0-CUDA-12.8.0 "
                                "NCCL/99.1.0-GCCcore-14.3.0-CUDA-13.0.0",
            "BASH_FUNC_module%%": MODULE}
