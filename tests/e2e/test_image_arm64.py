"""The GH200 (linux/arm64) image built and run, not only parsed: the project's Dockerfile
on an arm64 stand-in base, under QEMU user emulation on the x86_64 CI machine.

    python -m pytest -m image tests/e2e/test_image_arm64.py

tests/image/qemu.sh registers the aarch64 handler (qemu-user-static, binfmt-support),
build_arm64_base.sh makes the base (Debian arm64 with PyPI's CPU-only aarch64 torch 2.5.1,
assembled natively and cached like the amd64 stand-ins), build_image.sh builds the
Dockerfile for linux/arm64 on it (its RUN steps emulated; the session-scoped `arm64_image`
fixture in tests/conftest.py, which the registry tests push too), and a few training
steps run inside with `buildah run`. Emulation is slow (importing torch takes about 35 s),
so the run is three steps. What it proves: the Dockerfile, the
install script and the package work on arm64's Python, torch and file layout. What it
cannot: anything about Grace's speed, CUDA on GH200, or NGC's arm64 base.
"""

from __future__ import annotations

import json
import time

import pytest

from tests.helpers.images import STEPS, TRAIN, UNPRIVILEGED, entrypoint, installed_by, run_inside

pytestmark = [pytest.mark.image, pytest.mark.slow]


def test_arm64_image_is_arm64_and_says_what_it_installed(arm64_image, capsys):
    assert arm64_image.config["Architecture"] == "arm64"
    assert "DALI: none (torch is a CPU-only build" in arm64_image.log
    assert installed_by(arm64_image.log)["hpc-train"] == "0.1.0"
    with capsys.disabled():
        print("\narm64 image: " + ", ".join(f"{k} {v:.0f}s"
                                           for k, v in arm64_image.seconds.items()))


def test_arm64_image_trains_under_emulation(arm64_image, tmp_path, capsys):
    started = time.monotonic()
    proc, changed = run_inside(arm64_image, entrypoint(arm64_image) + TRAIN, tmp_path / "out",
                               UNPRIVILEGED)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((tmp_path / "out" / "run" / "summary.json").read_text())
    assert summary["steps_run"] == STEPS
    assert changed == [], f"the run wrote into the image's filesystem: {changed}"
    machine, _ = run_inside(arm64_image, ["uname", "-m"], tmp_path / "uname")
    assert machine.stdout.strip() == "aarch64"
    with capsys.disabled():
        print(f"\narm64 image: {STEPS} training steps in {time.monotonic() - started:.0f}s "
              "(emulated)")
