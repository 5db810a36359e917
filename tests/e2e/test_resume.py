"""Resume rules: auto, never, --overwrite, another run's checkpoints, unsafe loading."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from tests.helpers import read_jsonl, run_train
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


@pytest.fixture(scope="module")
def trained_once(tmp_path_factory):
    out = tmp_path_factory.mktemp("finished") / "run"
    return out, run_train([*ARGS, "--epochs", "1"], out)


@pytest.fixture
def finished_run(trained_once, tmp_path):
    """A copy of the module's one finished run, in this test's folder: the tests change it
    (a user may move a run folder, so a copy resumes as the original would)."""
    source, summary = trained_once
    out = tmp_path / "run"
    shutil.copytree(source, out, symlinks=True)
    return out, summary


def checkpoint_files(out):
    return sorted(str(p.relative_to(out)) for p in (out / "checkpoints").rglob("*"))


@pytest.mark.slow
def test_resume_never_refuses_a_directory_with_checkpoints(finished_run, capsys):
    out, _ = finished_run
    before = checkpoint_files(out)
    err = fails_with_usage_error([*ARGS, "--resume", "never", "--output-dir", str(out)], capsys)
    assert "already holds checkpoints" in err and "--overwrite" in err
    assert checkpoint_files(out) == before


@pytest.mark.slow
def test_resume_never_with_overwrite_starts_afresh(finished_run, tmp_path):
    out, _ = finished_run
    fresh = run_train([*ARGS, "--epochs", "1", "--seed", "6"], tmp_path / "fresh")
    replaced = run_train([*ARGS, "--epochs", "1", "--seed", "6", "--resume", "never",
                          "--overwrite"], out)
    assert replaced["model_sha256"] == fresh["model_sha256"]
    assert (out / "metrics.jsonl").read_text().count("\n") == 1


@pytest.mark.slow
def test_auto_refuses_the_checkpoints_of_a_run_with_other_settings(finished_run, capsys):
    out, _ = finished_run
    argv = [*ARGS, "--epochs", "1", "--width", "12", "--output-dir", str(out)]
    err = fails_with_usage_error(argv, capsys)
    assert "--width 8 there, 12 now" in err and "--output-dir" in err


@pytest.mark.slow
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


@pytest.mark.slow
def test_a_refused_resume_leaves_config_json_as_it_was(finished_run, capsys):
    out, _ = finished_run
    before = (out / "config.json").read_text()
    fails_with_usage_error([*ARGS, "--epochs", "1", "--width", "12", "--output-dir", str(out)],
                           capsys)
    assert (out / "config.json").read_text() == before


@pytest.mark.slow
def test_resume_path_to_another_model_s_checkpoint_is_one_line(finished_run, tmp_path, capsys):
    out, _ = finished_run
    path = out / "checkpoints" / "step-000000008"
    argv = [*ARGS, "--epochs", "1", "--width", "12", "--resume", str(path),
            "--output-dir", str(tmp_path / "other")]
    err = fails_with_usage_error(argv, capsys)
    assert f"--resume {path}" in err and "another model" in err and "--width 8 there" in err
    assert "Traceback" not in err


def forge(path, name: str, write) -> None:
    """Rewrite one file of a checkpoint and its manifest entry: the manifest verifies."""
    import json

    from workload.checkpoint.writer.store import MANIFEST
    from workload.files import sha256_file

    write(path / name)
    manifest = json.loads((path / MANIFEST).read_text())
    manifest["files"][name] = dict(bytes=(path / name).stat().st_size,
                                   sha256=sha256_file(path / name))
    (path / MANIFEST).write_text(json.dumps(manifest))


@pytest.mark.parametrize("name, write", [
    ("config.json", lambda f: f.write_text("not json")),
    ("trainer.json", lambda f: f.write_text('{"format": 2, "data": {"step": 8}}')),
    ("model.safetensors", lambda f: f.write_bytes(__import__("safetensors.torch").torch.save(
        {"other.weight": __import__("torch").ones(2)}))),
])
@pytest.mark.slow
def test_auto_moves_bad_content_aside_and_falls_back(finished_run, name, write, capsys):
    out, first = finished_run
    newest = out / "checkpoints" / "step-000000008"
    forge(newest, name, write)
    summary = run_train([*ARGS, "--epochs", "1"], out)
    logged = capsys.readouterr().out
    assert "skipping a bad checkpoint" in logged and name in logged
    assert "resumed from" in logged and "step-000000006" in logged
    assert summary["model_sha256"] == first["model_sha256"]
    assert list((out / "checkpoints").glob("step-000000008.corrupt-*"))


DAMAGED_METRICS_LINES = {
    "torn": (b'{"epoch": 2, "train_lo', "line 2: no newline at its end (a torn write)"),
    # json raised RecursionError, which nothing caught: every resume stopped
    "nested": (b"[" * 100_000 + b"]" * 100_000 + b"\n", "line 2: not a JSON object"),
    "not UTF-8": (b'{"epoch": 2, "note": "\xff"}\n', "line 2: not a JSON object"),
}


@pytest.mark.slow
@pytest.mark.parametrize("damage", DAMAGED_METRICS_LINES)
def test_a_damaged_metrics_line_does_not_stop_a_resume(finished_run, damage, capsys):
    out, first = finished_run
    line, warning = DAMAGED_METRICS_LINES[damage]
    with open(out / "metrics.jsonl", "ab") as f:
        f.write(line)
    summary = run_train([*ARGS, "--epochs", "2"], out)
    assert warning in capsys.readouterr().out
    assert [r["epoch"] for r in read_jsonl(out / "metrics.jsonl")] == [1, 2]
    assert summary["epochs_run"] == 2
