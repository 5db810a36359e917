"""The kit's install: the package and the carried wheels came in without network, and the
console scripts a user runs are the installed ones."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu


def test_the_installed_package_and_scripts_are_the_ones_used(under_kit, tmp_path):
    site = Path(os.environ["PYTHONPATH"].split(os.pathsep)[0])
    train = shutil.which("train")
    assert train is not None and Path(train).parent == site / "bin"
    # From a neutral folder, so the repository's own workload/ is not the one found.
    done = subprocess.run([sys.executable, "-c", "import hostlist, workload; "
                           "print(workload.__file__); print(hostlist.__file__)"],
                          capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stderr
    assert all(Path(line).is_relative_to(site) for line in done.stdout.split())
    version = subprocess.run([train, "--version"], capture_output=True, text=True,
                             cwd=tmp_path, timeout=120)
    assert version.returncode == 0 and "hpc-train" in version.stdout, version.stderr
