"""What the package ships: the digits data read with numpy alone, the licence files, and
runtime dependencies without scikit-learn or scipy.

    python -m pytest tests/unit/test_packaging.py
"""

from __future__ import annotations

import hashlib
import re
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import numpy as np
import pytest

from workload.data.datasets import DIGITS_FILE, load_digits, read_digits

ROOT = Path(__file__).resolve().parents[2]  # the repository: tests/unit/ is two down
# The file as scikit-learn 1.9.1 ships it (sklearn/datasets/data/digits.csv.gz); NOTICE
# names the same digest.
DIGITS_SHA256 = "09f66e6debdee2cd2b5ae59e0d6abbb73fc2b0e0185d2e1957e9ebb51e23aa22"
# Images per digit 0..9 in that file (the UCI test set).
DIGITS_PER_CLASS = [178, 182, 177, 183, 181, 182, 181, 179, 174, 180]


def test_digits_file_is_the_recorded_one_and_named_in_notice():
    digest = hashlib.sha256(DIGITS_FILE.read_bytes()).hexdigest()
    assert digest == DIGITS_SHA256
    assert digest in (ROOT / "NOTICE").read_text()


def test_digits_read_with_numpy_only():
    images, labels = read_digits()
    assert images.shape == (1797, 8, 8) and labels.dtype == np.int64
    assert images.min() == 0 and images.max() == 16
    assert np.bincount(labels).tolist() == DIGITS_PER_CLASS
    assert "sklearn" not in sys.modules


def test_digits_split_is_fixed_and_rgb_32px():
    split = load_digits()
    assert len(split.train) + len(split.test) == 1797 and len(split.test) == 359
    assert tuple(split.train.images.shape[1:]) == (3, 32, 32)
    assert split.train.labels[:5].tolist() == load_digits().train.labels[:5].tolist()


def test_a_damaged_digits_file_is_refused(tmp_path):
    import gzip
    bad = tmp_path / "digits.csv.gz"
    with gzip.open(bad, "wt") as f:
        f.write("1,2,3\n")
    with pytest.raises(ValueError, match="expected 64 pixels and a label"):
        read_digits(bad)


def test_runtime_dependencies_leave_out_scikit_learn_and_scipy():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = {dep.split(">")[0].split("=")[0].split("[")[0].strip().lower()
             for dep in project["dependencies"]}
    assert not names & {"scikit-learn", "sklearn", "scipy"}


def test_wheel_carries_the_digits_licence_and_notice(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
                    "--no-build-isolation", "--wheel-dir", str(tmp_path), str(ROOT)],
                   check=True, capture_output=True, cwd=tmp_path)
    wheel, = tmp_path.glob("hpc_train-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "workload/data/digits.csv.gz" in names
    licences = {Path(n).name for n in names if ".dist-info/" in n and "licen" in n.lower()}
    assert {"LICENSE", "NOTICE"} <= licences, names


def test_install_hints_name_what_the_report_extra_holds():
    """The package is not on PyPI: hints name the extra's packages, never 'hpc-train[...]'."""
    from workload import records, report
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]["report"]
    assert report.INSTALL_HINT.split()[2:] == extra
    # By name only from a direct URL ("hpc-train[report] @ git+https://..."), never from PyPI.
    by_name = re.compile(r"""pip install ['"]?(hpc-train[^'"\s]*)['"]?(\s+@)?""")
    hint_sources = [ROOT / "README.md", *ROOT.glob("docs/*.md"), *ROOT.glob("workload/**/*.py")]
    offenders = [f"{p}: {m.group(0)}" for p in hint_sources
                 for m in by_name.finditer(p.read_text()) if not m.group(2)]
    assert offenders == []
    assert records.open_board  # the writer's module imports without tensorboard installed
