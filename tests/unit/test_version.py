"""workload.commands: the `--version` text, read without importing torch or DALI."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from workload import commands
from workload.commands import Installed, dali_versions, torch_versions, version_text

TORCH_VERSION_PY = """from typing import Optional

__all__ = ['__version__', 'debug', 'cuda', 'git_version', 'hip', 'rocm', 'xpu']
__version__ = '2.14.1+cu130'
debug = False
cuda: Optional[str] = '13.0'
git_version = '5c4886908584029761b579af026dcfb627c84070'
hip: Optional[str] = None
"""
# NGC's source builds write the file in the older, unannotated form.
NGC_TORCH_VERSION_PY = """__version__ = '2.8.0a0+5228986c39.nv25.06'
debug = False
cuda = '12.9'
git_version = '5228986c395dc79f90d2a2b991deea1eef188260'
hip = None
"""
CPU_TORCH_VERSION_PY = "__version__ = '2.13.0+cpu'\ncuda: Optional[str] = None\n"
DALI_INIT_PY = """__version__ = '2.4.0'
__cuda_version__ = int('12.9.86'.replace('.', ''))
__git_sha__ = 'abc'
"""


@pytest.mark.parametrize("text, expected", [
    (TORCH_VERSION_PY, ("2.14.1+cu130", "13.0")),
    (NGC_TORCH_VERSION_PY, ("2.8.0a0+5228986c39.nv25.06", "12.9")),
    (CPU_TORCH_VERSION_PY, ("2.13.0+cpu", None)),
])
def test_torch_version_and_cuda_read_as_text(text, expected):
    assert torch_versions(text) == expected


def test_a_torch_version_file_that_is_code_is_not_run(tmp_path):
    marker = tmp_path / "ran"
    text = f"import pathlib; pathlib.Path({str(marker)!r}).touch()\ncuda = '13.0'\n"
    assert torch_versions(text)[1] == "13.0"
    assert not marker.exists()


def test_dali_version_and_cuda_read_as_text():
    assert dali_versions(DALI_INIT_PY) == ("2.4.0", "12.9.86")


def test_text_names_every_version():
    found = Installed("0.1.0", "2.14.1+cu130", "13.0", "2.4.0", "13.0.88")
    lines = version_text("train", found).splitlines()
    assert lines[:3] == ["train (hpc-train 0.1.0)", "torch 2.14.1+cu130, built for CUDA 13.0",
                         "DALI 2.4.0, built for CUDA 13.0.88"]
    assert lines[3].startswith("Python ")


def test_text_says_what_is_missing():
    text = version_text("doctor", Installed(None, "2.13.0+cpu", None, None, None))
    assert "not installed, run from a checkout" in text
    assert "torch 2.13.0+cpu, CPU-only build" in text and "DALI not installed" in text


def test_installed_agrees_with_the_imported_packages():
    import torch
    found = commands.installed()
    assert found.torch == torch.__version__ and found.torch_cuda == torch.version.cuda
    try:
        import nvidia.dali as dali
    except ImportError:
        assert found.dali is None
    else:
        assert found.dali == dali.__version__
        assert int(found.dali_cuda.replace(".", "")) == dali.__cuda_version__


def test_version_imports_neither_torch_nor_dali():
    probe = ("import sys; from workload.commands import version_text; print(version_text()); "
             "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'numpy') "
             "or m.startswith('nvidia.dali')))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=60, check=True)
    assert done.stdout.splitlines()[-1] == "[]"
    assert "torch " in done.stdout


def test_version_argument_prints_the_lines_and_exits_0(capsys):
    parser = argparse.ArgumentParser(prog="bench")
    commands.add_version_argument(parser)
    with pytest.raises(SystemExit) as exit_:
        parser.parse_args(["--version"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("bench (hpc-train ") and out[1].startswith("torch ")
