"""The NCCL match check (workload/launch/nccl.py): versions read from libnccl files the
way a site module and an NGC image name them, and the verdict a job stops on."""

from __future__ import annotations

import os
from pathlib import Path

from workload.launch import nccl

MODULES = ["NCCL/2.22.3-GCCcore-13.3.0-CUDA-12.6.0", "NCCL/2.26.6-GCCcore-14.2.0-CUDA-12.8.0",
           "NCCL/2.27.7-GCCcore-14.3.0-CUDA-12.9.1", "NCCL/2.30.4-GCCcore-14.3.0-CUDA-13.0.0"]


def easybuild_library(folder: Path, version: str) -> Path:
    """libnccl.so.2 -> libnccl.so.X.Y.Z, as EasyBuild and NGC install it."""
    folder.mkdir(parents=True)
    (folder / f"libnccl.so.{version}").write_bytes(b"\x7fELF not a real library")
    (folder / "libnccl.so.2").symlink_to(f"libnccl.so.{version}")
    return folder / "libnccl.so.2"


def wheel_library(folder: Path, version: str) -> Path:
    """A plain libnccl.so.2 (the pip wheel's) whose only version is the string inside."""
    folder.mkdir(parents=True)
    path = folder / "libnccl.so.2"
    path.write_bytes(b"\0" * 5000 + f"NCCL version {version}+cuda12.9\0".encode() + b"\0" * 99)
    return path


def test_the_version_comes_from_the_file_name_or_the_string_inside(tmp_path):
    assert nccl.library_version(easybuild_library(tmp_path / "eb", "2.26.6")) == (2, 26, 6)
    assert nccl.library_version(wheel_library(tmp_path / "wheel", "2.27.3")) == (2, 27, 3)
    (tmp_path / "empty.so").write_bytes(b"")
    assert nccl.library_version(tmp_path / "empty.so") is None


def test_an_older_bound_library_stops_the_job_naming_the_oldest_module_new_enough(tmp_path):
    bound = easybuild_library(tmp_path / "NCCL-2.26.6" / "lib", "2.26.6")
    fine, line = nccl.verdict((2, 26, 6), (2, 27, 3), bound, MODULES)
    assert not fine
    assert line == (f"nccl: the bound libnccl 2.26.6 ({bound.parent}) is older than 2.27.3, "
                    "the NCCL torch was built with: load NCCL/2.27.7-GCCcore-14.3.0-CUDA-12.9.1 "
                    "instead (NCCL_MODULE=NCCL/2.27.7-GCCcore-14.3.0-CUDA-12.9.1)")
    fine, line = nccl.verdict((2, 26, 6), (2, 31, 0), bound, MODULES)
    assert not fine and "load an NCCL module >= 2.31.0" in line


def test_a_bound_library_as_new_or_newer_passes(tmp_path):
    bound = tmp_path / "libnccl.so.2"
    assert nccl.verdict((2, 27, 7), (2, 27, 7), bound, MODULES)[0]
    assert nccl.verdict((2, 30, 4), (2, 27, 3), bound, [])[0]
    fine, line = nccl.verdict(None, (2, 27, 3), bound, [])
    assert fine and "cannot tell" in line  # unknown: said, not a stop


def test_check_reads_the_first_libnccl_on_the_library_path(tmp_path):
    old = easybuild_library(tmp_path / "site" / "lib", "2.26.6")
    env = {"LD_LIBRARY_PATH": f"{tmp_path / 'nothing'}:{old.parent}"}
    fine, line = nccl.check(env, MODULES, needed=(2, 27, 3))
    assert not fine and "2.26.6" in line and "NCCL_MODULE=NCCL/2.27.7" in line
    assert nccl.check({"LD_LIBRARY_PATH": ""}, MODULES, needed=(2, 27, 3))[0]


def test_torch_is_asked_without_the_bound_folder(tmp_path):
    # A bound folder any process would fail to start with: if it reached torch's process,
    # the dynamic loader would take this libc and the answer would be None.
    bound = tmp_path / "site"
    bound.mkdir()
    (bound / "libc.so.6").write_bytes(b"not a library")
    env = dict(os.environ, LD_LIBRARY_PATH=f"{bound}:/elsewhere")
    # The venv's torch answers with its own NCCL (a CUDA build reports it on the CPU).
    version = nccl.torch_version(env, str(bound))
    assert version is not None, "torch's process failed: was the bound folder passed on?"
    assert version[0] == 2 and version[1] >= 18
