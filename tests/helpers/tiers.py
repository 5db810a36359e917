"""The suite's tiers, and the guard that keeps their markers true.

`make check` runs the tests with none of the markers below: they need no root, no Debian
package, no SLURM and no image, and start no training. A test without a marker that does
any of these fails, naming the marker to add:

- a fixture that needs a marker (FIXTURE_MARKERS), requested without it;
- a program of a marker's (PROGRAM_MARKERS) started without it, from this process;
- a training or a torch process group without `slow`, in this process or in any Python
  process it starts (tier_guard/sitecustomize.py, carried through PYTHONPATH).

The guard is on in every run, `make test` included, so a test cannot pass in one tier and
break the other.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.helpers.tier_guard import sitecustomize as in_process

HEAVY_MARKERS = ("slow", "slurm", "image", "root", "gpu")
FAST_TIER = " and ".join(f"not {marker}" for marker in HEAVY_MARKERS)
FIXTURE_MARKERS = {"slurm_cluster": "slurm", "slurm_session": "slurm", "image": "image",
                   "arm64_image": "image", "registry": "image"}
PROGRAM_MARKERS = {
    **dict.fromkeys(("torchrun", "strace"), "slow"),
    **dict.fromkeys(("srun", "sbatch", "salloc", "scancel", "scontrol", "squeue", "sacct",
                     "sacctmgr", "slurmctld", "slurmd", "slurmdbd", "munged"), "slurm"),
    **dict.fromkeys(("podman", "buildah", "skopeo", "ch-run", "ch-image", "ch-convert",
                     "apptainer", "docker-registry"), "image"),
    **dict.fromkeys(("mount", "umount", "mkfs.vfat", "mkfs.ext4", "fsfreeze", "losetup",
                     "fusefat", "unshare", "nsenter"), "root"),
}
GUARD_FOLDER = Path(in_process.__file__).parent
_popen_init = subprocess.Popen.__init__


def markers_of(item: pytest.Item) -> set[str]:
    return {mark.name for mark in item.iter_markers()}


def missing_fixture_markers(item: pytest.Item) -> list[str]:
    have = markers_of(item)
    return [f"fixture {name!r} needs the {marker!r} marker"
            for name, marker in FIXTURE_MARKERS.items()
            if name in getattr(item, "fixturenames", ()) and marker not in have]


def program_of(args) -> str:
    first = args if isinstance(args, (str, bytes, os.PathLike)) else next(iter(args), "")
    return os.path.basename(os.fsdecode(first).split()[0] if first else "")


class Guard:
    """What one test may start, from its markers; `close` names what it should not have."""

    def __init__(self, markers: set[str], report: Path):
        self.markers, self.report = markers, report
        self.refused: list[str] = []

    def __enter__(self) -> Guard:
        guard = self
        # The GPU tier runs only where a GPU is (make gpu-check), never in the fast tier:
        # its tests may train and start any program, as slow ones may.
        slow = bool({"slow", "gpu"} & self.markers)

        def popen_init(popen, args, *rest, **kwargs):
            marker = PROGRAM_MARKERS.get(program_of(args))
            if marker and marker not in guard.markers and "gpu" not in guard.markers:
                guard.refused.append(f"{program_of(args)} needs the {marker!r} marker")
                raise in_process.UnmarkedHeavyWork(guard.refused[-1])
            if not slow:
                kwargs["env"] = guarded_env(kwargs.get("env"), guard.report)
            _popen_init(popen, args, *rest, **kwargs)

        subprocess.Popen.__init__ = popen_init
        in_process.refuse_training(None if slow else str(self.report))
        return self

    def __exit__(self, *exc) -> None:
        subprocess.Popen.__init__ = _popen_init
        in_process.refuse_training(None)

    def problems(self) -> list[str]:
        started = self.report.read_text().splitlines() if self.report.exists() else []
        return self.refused + started


def guarded_env(env: dict | None, report: Path) -> dict:
    env = dict(os.environ if env is None else env)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (str(GUARD_FOLDER),
                                                      env.get("PYTHONPATH"))))
    env[in_process.REPORT_VARIABLE] = str(report)
    return env


# Under pytest-xdist (make test): the image tests run on two workers, one for the amd64
# images and one for the arm64 image and the registry that pushes both (a lock in
# tests/helpers/images.py builds each image once), so the emulated arm64 build overlaps
# the amd64 ones; the SLURM tests are dealt out one by one, in collection order, over
# SLURM_WORKERS workers, each starting its own private cluster (tests/slurm: ports picked
# free), so their waits overlap. One by one, not by module: a module's tests cost alike,
# so each worker gets a share of every module, where whole modules made one worker's share
# (the site pages and preemption, 1,650 s) nearly four times the other's (440 s). Three:
# with two, the SLURM tests (mostly waits for SLURM and the jobs' ranks) were the longest
# path of make test (docs/development.md).
SLURM_WORKERS = 3
ARM64_FIXTURES = ("arm64_image", "registry")


def xdist_group(item: pytest.Item, slurm_order: dict[str, int]) -> str | None:
    markers = markers_of(item)
    if "image" in markers:
        needs = getattr(item, "fixturenames", ())
        return "image-arm64" if any(name in needs for name in ARM64_FIXTURES) else "image"
    if "slurm" in markers:
        return f"slurm-{slurm_order[item.nodeid] % SLURM_WORKERS}"
    if takes_a_module_fixture(item):
        return f"module-{item.module.__name__}"
    return None


def takes_a_module_fixture(item: pytest.Item) -> bool:
    """Whether the test takes a module-scoped fixture (a shared training run): xdist makes
    such a fixture once per worker, so the tests that share it go to one worker, where it
    is made once (the compile-cache module's two cold compiles ran twice otherwise)."""
    fixtures = getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", {})
    return any(defs and defs[-1].scope == "module" for defs in fixtures.values())


def group_for_workers(items: list[pytest.Item]) -> None:
    slurm_tests = [item.nodeid for item in items if item.get_closest_marker("slurm")]
    slurm_order = {nodeid: position for position, nodeid in enumerate(slurm_tests)}
    for item in items:
        if group := xdist_group(item, slurm_order):
            item.add_marker(pytest.mark.xdist_group(group))
