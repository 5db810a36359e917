"""doctor's driver check: the node's driver against the CUDA of the image's torch, with
fake driver files and versions (no GPU here), and the tag it tells users to take."""

from __future__ import annotations

import pytest

from workload.doctor import driver
from workload.doctor.driver import driver_finding, driver_from_proc, read_driver, tag_for

PROC_X86 = ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  565.57.01  Thu Oct 10 12:29:05 "
            "UTC 2024\nGCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n")
PROC_ARM_OPEN = ("NVRM version: NVIDIA UNIX Open Kernel Module for aarch64  580.65.06  "
                 "Release Build  (dvs-builder@U16-I3-B03-4-3)  Sun Jul 27 06:54:38 UTC 2025\n")


@pytest.mark.parametrize("text, expected", [
    (PROC_X86, (565, 57, 1)),
    (PROC_ARM_OPEN, (580, 65, 6)),
    ("NVRM version: something else\n", None),
])
def test_driver_version_from_proc(text, expected):
    assert driver_from_proc(text) == expected


def test_read_driver_prefers_proc_then_nvidia_smi_then_says_none(tmp_path, monkeypatch):
    proc = tmp_path / "version"
    proc.write_text(PROC_ARM_OPEN)
    assert read_driver(proc) == ((580, 65, 6), str(proc))
    smi = tmp_path / "bin" / "nvidia-smi"
    smi.parent.mkdir()
    smi.write_text("#!/bin/sh\necho 570.133.20\necho 570.133.20\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", str(smi.parent))
    assert read_driver(tmp_path / "missing") == ((570, 133, 20), "nvidia-smi")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    version, why = read_driver(tmp_path / "missing")
    assert version is None and "no working nvidia-smi" in why


# driver, image CUDA, forward-compat libraries present, status, words in detail+fix
CASES = [
    # Olivia: an R565 driver runs the CUDA 12 flavour (12.9) by minor-version compatibility.
    ((565, 57, 1), (12, 9), True, "info", ["565.57.01", "CUDA 12.9", "minor-version"]),
    ((575, 51, 3), (12, 9), True, "ok", ["575.51.03"]),
    ((580, 65, 6), (13, 0), False, "ok", ["580.65.06", "CUDA 13.0"]),
    ((590, 44, 1), (12, 9), False, "ok", []),
    # R565 on the CUDA 13 flavour: the other major; forward compat may bridge it, else not.
    ((565, 57, 1), (13, 0), True, "warn", ["forward compatibility", "-cuda12"]),
    ((565, 57, 1), (13, 0), False, "fail", ["too old", "use the -cuda12 image"]),
    ((535, 183, 1), (13, 0), False, "fail", ["use the -cuda12 image"]),
    # Older than any flavour: no tag helps.
    ((470, 256, 2), (12, 9), False, "fail", ["no published flavour", "R525+"]),
]


@pytest.mark.parametrize("version, cuda, compat, status, words", CASES)
def test_verdict_and_the_tag_it_names(version, cuda, compat, status, words):
    found = driver_finding(version, "/proc/driver/nvidia/version", cuda, compat)
    assert found.check == "driver" and found.status == status, found
    text = found.detail + " " + found.fix
    assert all(w in text for w in words), text
    if status in ("warn", "fail"):
        assert found.fix


def test_no_driver_and_cpu_torch_are_informational():
    assert driver_finding(None, "no /proc/driver/nvidia/version", (13, 0), False).status == "info"
    assert driver_finding((580, 65, 6), "nvidia-smi", None, False).status == "info"


@pytest.mark.parametrize("version, tag", [((580, 65, 6), "cuda13"), ((575, 51, 3), "cuda12"),
                                          ((525, 60, 13), "cuda12"), ((520, 61, 5), None)])
def test_tag_for_a_driver(version, tag):
    assert tag_for(version) == tag


def test_minimum_drivers_grow_with_the_cuda_release():
    ordered = [driver.MIN_DRIVER[c] for c in sorted(driver.MIN_DRIVER)]
    assert ordered == sorted(ordered)
    assert driver.required_driver((12, 7)) == driver.MIN_DRIVER[(12, 6)]  # no 12.7 toolkit


def test_the_real_check_runs_here(monkeypatch):
    """This machine has no GPU: no driver, torch 2.14.1+cu130 -> an informational line."""
    monkeypatch.setattr(driver, "PROC_VERSION", driver.PROC_VERSION)
    found = driver.driver_check()
    assert found.status in ("info", "ok", "warn", "fail") and "CUDA" in found.detail
