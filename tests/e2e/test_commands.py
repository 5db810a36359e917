"""Every command the way users run it: the installed console scripts and the `python -m`
entries as subprocesses, their exit statuses (0 done, 2 usage or refusal, 75 requeue; the
table in docs/cluster.md#exit-statuses) and where their output goes. A main() that returns
a value hands it to sys.exit through the console-script wrapper, which an in-process call
never sees."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO, clean_env

BIN = Path(sys.executable).parent
SCRIPTS = ("train", "bench", "report", "doctor", "evaluate", "predict", "diagnose")
# Every `python -m` entry: the commands' modules and the torch-free launch layer.
MODULES = ("workload.train", "workload.bench.cli", "workload.report", "workload.doctor",
           "workload.evaluate", "workload.predict", "workload.launch", "workload.diagnose")


def run(argv: list[str]) -> subprocess.CompletedProcess:
    """The command as a user runs it, importing this checkout's package."""
    env = dict(clean_env(), PYTHONPATH=f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300)


@pytest.mark.parametrize("script", SCRIPTS)
def test_each_console_script_answers_help_version_and_a_bad_flag(script):
    done = run([str(BIN / script), "--help"])
    assert done.returncode == 0 and done.stdout.startswith(f"usage: {script}"), done.stderr
    done = run([str(BIN / script), "--version"])
    assert done.returncode == 0 and done.stdout.startswith(script), done.stderr
    done = run([str(BIN / script), "--no-such-flag"])
    assert done.returncode == 2 and f"{script}: error: " in done.stderr


SOURCES = dict(train="workload/train.py", bench="workload/bench/cli.py",
               report="workload/report.py", doctor="workload/doctor/__init__.py",
               evaluate="workload/evaluate.py", predict="workload/predict.py",
               diagnose="workload/diagnose/__init__.py")


@pytest.mark.parametrize("script", SCRIPTS)
def test_help_keeps_each_continued_example_line_as_written(script):
    # A shell example continued with a backslash must stay two lines a user can paste (a
    # lone backslash in the docstring joined them, and the help printed them as one).
    source = (REPO / SOURCES[script]).read_text().split('"""')[1]
    continued = [line.replace("\\\\", "\\") for line in source.splitlines()
                 if line.rstrip().endswith("\\")]
    shown = run([str(BIN / script), "--help"]).stdout.splitlines()
    for line in continued:
        assert line in shown, f"{script} --help lost the line break after {line!r}"


@pytest.mark.parametrize("module", MODULES)
def test_each_python_m_entry_answers_help(module):
    done = run([sys.executable, "-m", module, "--help"])
    assert done.returncode == 0 and done.stdout.startswith("usage: "), done.stderr


@pytest.mark.parametrize("module", MODULES)
def test_each_python_m_entry_prints_the_version(module):
    done = run([sys.executable, "-m", module, "--version"])
    assert done.returncode == 0 and "hpc-train" in done.stdout, done.stderr


@pytest.mark.slow
def test_evaluate_exits_0_with_its_one_line_on_stdout(digits_run):
    done = run([str(BIN / "evaluate"), str(digits_run), "--device", "cpu"])
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("evaluate: accuracy ") and len(done.stdout.splitlines()) == 1
    assert "'accuracy'" not in done.stderr  # the result dict is not printed by sys.exit


@pytest.mark.slow
def test_predict_exits_0_whatever_the_number_of_images(digits_run, tmp_path):
    from PIL import Image

    for i in range(3):  # predict used to exit with the number of images
        Image.new("RGB", (16, 16), (i * 80, 0, 0)).save(tmp_path / f"{i}.png")
    done = run([str(BIN / "predict"), str(digits_run), str(tmp_path), "--device", "cpu"])
    assert done.returncode == 0, done.stderr
    assert len(done.stdout.splitlines()) == 3


def test_a_refused_model_is_exit_2_and_one_line(tmp_path):
    for script in ("evaluate", "predict"):
        argv = [str(BIN / script), str(tmp_path / "missing")]
        done = run(argv + ([] if script == "evaluate" else [str(tmp_path)]))
        assert done.returncode == 2 and len(done.stderr.splitlines()) == 1, done.stderr
