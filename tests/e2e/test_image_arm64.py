"""The GH200 (linux/arm64) image built and run, not only parsed: the project's Dockerfile
on an arm64 stand-in base, under QEMU user emulation on the x86_64 CI machine.

    python -m pytest -m image tests/e2e/test_image_arm64.py

tests/image/qemu.sh registers the aarch64 handler (qemu-user-static, binfmt-support),
build_arm64_base.sh makes the base (Debian arm64 with PyPI's CPU-only aarch64 torch 2.5.1,
assembled natively and cached like the amd64 stand-ins), build_image.sh builds the
Dockerfile for linux/arm64 on it (its RUN steps emulated; the session-scoped `arm64_image`
fixture in tests/conftest.py). Its training run is in tests/e2e/test_image_registry.py:
pulled from the registry by platform, as a site's x86_64 login node pulls it, and run
under ch-run, unprivileged and read-only, for three steps of synthetic images (its
imports take about 13 s emulated, its first step 12). What they prove: the Dockerfile,
the install script and the package work on arm64's Python, torch and file layout. What
they cannot: anything about Grace's speed, CUDA on GH200, or NGC's arm64 base.
"""

from __future__ import annotations

import pytest

from tests.helpers.images import installed_by

pytestmark = [pytest.mark.image, pytest.mark.slow]


def test_arm64_image_is_arm64_and_says_what_it_installed(arm64_image, capsys):
    assert arm64_image.config["Architecture"] == "arm64"
    # The image's record of both steps, cached or not in this build.
    assert "DALI: none (torch is a CPU-only build" in arm64_image.record
    assert installed_by(arm64_image.record)["hpc-train"] == "0.1.0"
    with capsys.disabled():
        print("\narm64 image: " + ", ".join(f"{k} {v:.0f}s"
                                           for k, v in arm64_image.seconds.items()))
