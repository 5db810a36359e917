"""The run folder's JSON files: strict JSON on the way out (no NaN/Infinity), and a torn
last line of metrics.jsonl dropped with a warning instead of breaking every resume; and
its files named in one place (workload.runfolder)."""

from __future__ import annotations

import ast
import json
import math
from pathlib import Path

import pytest

from workload.checkpoint.resuming import trim_metrics
from workload.files import append_jsonl, read_jsonl_records, write_json


def strict(text: str):
    def refuse(constant):
        raise ValueError(f"not JSON: {constant}")
    return json.loads(text, parse_constant=refuse)


def test_non_finite_numbers_are_written_as_null(tmp_path):
    write_json(tmp_path / "summary.json", {"loss": math.nan, "rate": [1.0, math.inf]})
    assert strict((tmp_path / "summary.json").read_text()) == {"loss": None, "rate": [1.0, None]}
    append_jsonl(tmp_path / "metrics.jsonl", {"epoch": 1, "train_loss": -math.inf})
    assert strict((tmp_path / "metrics.jsonl").read_text()) == {"epoch": 1, "train_loss": None}


def test_a_torn_last_line_is_dropped_with_a_warning(tmp_path, caplog):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"epoch": 1}\n{"epoch": 2}\n{"epoch": 3, "train_lo')
    records, dropped = read_jsonl_records(path)
    assert records == [{"epoch": 1}, {"epoch": 2}] and "torn" in dropped[0]
    trim_metrics(path, epochs_done=2)
    assert path.read_text() == '{"epoch": 1}\n{"epoch": 2}\n'
    assert "torn" in caplog.text


def test_a_resume_says_which_lines_its_rewrite_of_the_metrics_drops(tmp_path, caplog):
    """Issue 59 section 5: a rewrite says what it removes: the epochs after the
    checkpoint (run again), and lines without an epoch train writes (epoch 1e30)."""
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"epoch": 1}\n{"epoch": 2}\n{"epoch": 3}\n{"epoch": 1e30}\n')
    with caplog.at_level("INFO"):
        trim_metrics(path, epochs_done=1)
    assert path.read_text() == '{"epoch": 1}\n'
    assert (f"{path}: dropping the lines of 2 epochs after epoch 1, where the checkpoint "
            "stands (this run writes them again)") in caplog.text
    assert (f"{path}: dropping 1 lines without an epoch train writes (epoch 1e+30 is not a "
            "whole number)") in caplog.text


def test_a_complete_line_that_is_not_a_record_is_dropped_too(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"epoch": 1}\nNaN garbage\n[1]\n{"epoch": 2}\n')
    trim_metrics(path, epochs_done=1)
    assert path.read_text() == '{"epoch": 1}\n'


@pytest.mark.root
def test_a_full_disk_at_the_final_model_is_the_disk_full_message(tmp_path):
    """safetensors reports a full disk as its own SafetensorError, which no handler took:
    the final write gets a checkpoint save's message and exit status (2), and leaves no
    partial file."""
    from types import SimpleNamespace

    import torch

    from tests.helpers import tmpfs
    from workload.config import TrainConfig
    from workload.errors import UsageError
    from workload.runfolder import RunFolder
    from workload.training.run import save_model

    data = SimpleNamespace(num_classes=4, classes=None, mean=(0.5,) * 3, std=(0.25,) * 3)
    model = torch.nn.Linear(1000, 200)  # 800 kB of weights for 256 kB of disk
    with tmpfs(tmp_path / "small", "size=256k") as out:
        try:
            save_model(TrainConfig(), data, model, RunFolder(out), write=True)
        except UsageError as error:
            message = str(error)
        else:
            raise AssertionError("the model was written to a disk too small for it")
        assert "no space left" in message and str(out) in message and "MiB free" in message
        assert "\n" not in message and sorted(p.name for p in out.iterdir()) == []


def test_the_run_folders_own_files_are_named_in_runfolder_only():
    """A command that needs a run's file takes its path from RunFolder, so no two
    commands can disagree about where it is (names a checkpoint folder shares, such as
    config.json, are left out; the boards' folders share theirs with their packages and
    flags, so only a path made of them counts: `out / "tensorboard"`)."""
    from workload import runfolder
    names = {runfolder.METRICS, runfolder.STEPS, runfolder.SUMMARY, runfolder.MODEL_JSON,
             runfolder.LOCK, runfolder.COMPILE_CACHES}
    folders = {runfolder.TENSORBOARD, runfolder.WANDB}
    package = Path(runfolder.__file__).parent

    def spells(node: ast.AST) -> bool:
        if isinstance(node, ast.Constant):
            return node.value in names
        return (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div)
                and isinstance(node.right, ast.Constant) and node.right.value in folders)
    spelled = [f"{path.relative_to(package)}:{node.lineno} {ast.unparse(node)}"
               for path in sorted(package.rglob("*.py")) if path.name != "runfolder.py"
               for node in ast.walk(ast.parse(path.read_text())) if spells(node)]
    assert spelled == []


def test_overwrite_removes_by_name_in_the_held_run_folder_never_through_a_swapped_link(
        tmp_path):
    """Issue 59 §2: --overwrite removes the previous run's checkpoints and records by
    their names in the run folder train holds; the folder renamed away and a link to
    another folder of the user's put at its name (a neighbour in a group-writable project
    folder) leaves that folder's step-* folders and records alone."""
    from types import SimpleNamespace

    from workload.checkpoint.resuming import prepare
    from workload.runfolder import RunFolder

    def previous_run(folder: Path) -> None:
        (folder / "checkpoints" / "step-000000004").mkdir(parents=True)
        (folder / "checkpoints" / "step-000000004" / "model.safetensors").write_text("w")
        (folder / "checkpoints" / "latest").write_text("step-000000004\n")
        (folder / "metrics.jsonl").write_text('{"epoch": 1}\n')

    run, other = tmp_path / "run", tmp_path / "other"
    previous_run(run)
    previous_run(other)
    folder = RunFolder(run).hold()
    run.rename(tmp_path / "run.moved")
    run.symlink_to(other)
    cfg = SimpleNamespace(checkpoint=SimpleNamespace(resume="never", overwrite=True,
                                                     checkpoint_local=""))
    prepare(cfg, folder, is_main=True)
    moved = tmp_path / "run.moved"
    assert list((moved / "checkpoints").iterdir()) == [] and not (moved / "metrics.jsonl").exists()
    assert sorted(p.name for p in (other / "checkpoints").iterdir()) == ["latest",
                                                                          "step-000000004"]
    assert (other / "checkpoints" / "step-000000004" / "model.safetensors").read_text() == "w"
    assert (other / "metrics.jsonl").is_file()


def test_a_held_run_folder_is_written_in_the_folder_it_started_in(tmp_path):
    """RunFolder.hold: its files are reached through the descriptor opened then, so the
    folder renamed away and a link put at its name changes nothing the run writes; a
    message still names the folder as given."""
    from workload.runfolder import RunFolder

    (tmp_path / "run").mkdir()
    (tmp_path / "elsewhere").mkdir()
    folder = RunFolder(tmp_path / "run").hold()
    (tmp_path / "run").rename(tmp_path / "run.moved")
    (tmp_path / "run").symlink_to(tmp_path / "elsewhere")
    write_json(folder.summary, {"done": True})
    append_jsonl(folder.metrics, {"epoch": 1})
    assert sorted(p.name for p in (tmp_path / "run.moved").iterdir()) == ["metrics.jsonl",
                                                                          "summary.json"]
    assert list((tmp_path / "elsewhere").iterdir()) == []
    assert folder.said(f"{folder.metrics} is a link") == f"{tmp_path}/run/metrics.jsonl is a link"


def test_trains_messages_name_the_held_run_folder_as_given(tmp_path, caplog):
    """What train says while it holds the run folder (a log line, an error's message,
    whatever deep module made it from a held path) names the folder as the user gave it,
    and an error keeps its type (its exit status)."""
    from workload.checkpoint.writer.diskfull import DiskFull
    from workload.logs import logger, messages_rewritten
    from workload.runfolder import RunFolder

    (tmp_path / "run").mkdir()
    folder = RunFolder(tmp_path / "run").hold()
    with pytest.raises(DiskFull) as raised, caplog.at_level("INFO", logger="workload"):
        with messages_rewritten(folder.said):
            logger.info("saved %s", folder.checkpoints / "step-000000002")
            raise DiskFull(f"no space left to save a checkpoint in {folder.checkpoints}")
    assert caplog.records[-1].getMessage() == f"saved {tmp_path}/run/checkpoints/step-000000002"
    assert str(raised.value) == f"no space left to save a checkpoint in {tmp_path}/run/checkpoints"
    other = f"{folder.held}1/model.safetensors"  # another held folder's descriptor: 31 for 3
    assert folder.said(other) == other
