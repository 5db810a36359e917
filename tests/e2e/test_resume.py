"""Resume rules: auto, never, --overwrite, another run's checkpoints, unsafe loading."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.helpers import run_train
from tests.helpers import CHECKPOINT_ARGS as ARGS
from workload.config import Every
from workload.errors import UsageError
from workload.train import main as train_main


def fails_with_usage_error(argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as exit_info:
        train_main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert len([line for line in err.splitlines() if "error:" in line]) == 1, err
    return err


@pytest.fixture
def finished_run(tmp_path):
    out = tmp_path / "run"
    summary = run_train([*ARGS, "--epochs", "1"], out)
    return out, summary


def checkpoint_files(out):
    return sorted(str(p.relative_to(out)) for p in (out / "checkpoints").rglob("*"))


def test_resume_never_refuses_a_directory_with_checkpoints(finished_run, capsys):
    out, _ = finished_run
    before = checkpoint_files(out)
    err = fails_with_usage_error([*ARGS, "--resume", "never", "--output-dir", str(out)], capsys)
    assert "already holds checkpoints" in err and "--overwrite" in err
    assert checkpoint_files(out) == before


def test_resume_never_with_overwrite_starts_afresh(finished_run, tmp_path):
    out, _ = finished_run
    fresh = run_train([*ARGS, "--epochs", "1", "--seed", "6"], tmp_path / "fresh")
    replaced = run_train([*ARGS, "--epochs", "1", "--seed", "6", "--resume", "never",
                          "--overwrite"], out)
    assert replaced["model_sha256"] == fresh["model_sha256"]
    assert (out / "metrics.jsonl").read_text().count("\n") == 1


def test_auto_refuses_the_checkpoints_of_a_run_with_other_settings(finished_run, capsys):
    out, _ = finished_run
    argv = [*ARGS, "--epochs", "1", "--width", "12", "--output-dir", str(out)]
    err = fails_with_usage_error(argv, capsys)
    assert "--width 8 there, 12 now" in err and "--output-dir" in err


def test_more_epochs_continue_a_finished_run(finished_run, capsys):
    out, first = finished_run
    summary = run_train([*ARGS, "--epochs", "2"], out)
    assert "resumed from" in capsys.readouterr().out
    assert summary["epochs_run"] == 2 and summary["steps_run"] == 16


def test_unsafe_load_switch_in_the_environment_is_refused(tmp_path):
    env = {"TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1", "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-m", "workload.train", *ARGS, "--output-dir",
                           str(tmp_path / "run")], capture_output=True, text=True, env=env)
    assert done.returncode == 2
    assert done.stderr.startswith("train: error: TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1")
    assert "unset it" in done.stderr and not (tmp_path / "run").exists()


@pytest.mark.parametrize("flags, words", [
    (["--checkpoint-every", "ten"], ["--checkpoint-every 'ten'", "10m"]),
    (["--checkpoint-every", "5d"], ["--checkpoint-every '5d'", "500"]),
    (["--keep-checkpoints", "0"], ["--keep-checkpoints", "1 or more"]),
    (["--overwrite"], ["--overwrite", "--resume never"]),
    (["--resume", "/nonexistent/step-1"], ["--resume /nonexistent/step-1", "auto"]),
    (["--preempt-signal", "KILL"], ["--preempt-signal", "USR2"]),
])
def test_bad_checkpoint_flags_exit_2(flags, words, tmp_path, capsys):
    out = tmp_path / "run"
    err = fails_with_usage_error([*ARGS, *flags, "--output-dir", str(out)], capsys)
    for word in words:
        assert word in err
    assert not out.exists()


@pytest.mark.parametrize("text, expected", [
    ("500", (500, 0.0)), ("10m", (0, 600.0)), ("90s", (0, 90.0)), ("1h", (0, 3600.0)),
    ("0", (0, 0.0)),
])
def test_checkpoint_every_reads_steps_or_durations(text, expected):
    every = Every.parse(text)
    assert (every.steps, every.seconds) == expected
    assert Every.parse(str(every)) == every  # config.json's text reads back the same
    with pytest.raises(UsageError):
        Every.parse("1.5h")
