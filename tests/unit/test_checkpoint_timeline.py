"""The run's timeline in checkpoints/: what `latest` allows `--resume auto` to continue
from, a rollback's abandoned steps, and which entries are `train`'s own."""

from __future__ import annotations

from pathlib import Path

import pytest

from workload.checkpoint.writer.folder import latest_step, on_timeline, roll_back, written_by_train


def steps(root: Path, *numbers: int, latest: int | None = None) -> Path:
    root.mkdir(exist_ok=True)
    for number in numbers:
        (root / f"step-{number:09d}").mkdir()
        (root / f"step-{number:09d}" / "MANIFEST.json").write_text("{}")
    if latest is not None:
        (root / "latest").write_text(f"step-{latest:09d}\n")
    return root


@pytest.mark.parametrize("text, expected", [
    ("step-000000012\n", 12), ("", None), ("../elsewhere", None), ("step-12x", None)])
def test_latest_names_a_step_or_nothing(tmp_path, text, expected):
    (tmp_path / "latest").write_text(text)
    assert latest_step(tmp_path) == expected
    assert latest_step(tmp_path / "missing") is None


def test_auto_continues_only_up_to_latest(tmp_path):
    root = steps(tmp_path / "checkpoints", 2, 4, 6, 8, latest=4)
    assert [s for s, _ in on_timeline(root)] == [2, 4]
    (root / "latest").unlink()  # an earlier version's folder: every step counts
    assert [s for s, _ in on_timeline(root)] == [2, 4, 6, 8]


def test_a_rollback_keeps_the_later_steps_aside(tmp_path):
    root = steps(tmp_path / "checkpoints", 2, 4, 6, 8, latest=8)
    roll_back(root, root / "step-000000004", 4)
    assert latest_step(root) == 4
    assert sorted(p.name for p in root.iterdir() if p.name.startswith("step-"))[:2] == [
        "step-000000002", "step-000000004"]
    aside = sorted(p.name.split(".")[0] for p in root.glob("step-*.abandoned-*"))
    assert aside == ["step-000000006", "step-000000008"]
    assert all((p / "MANIFEST.json").is_file() for p in root.glob("step-*.abandoned-*"))


def test_a_checkpoint_of_another_folder_leaves_the_timeline(tmp_path):
    root = steps(tmp_path / "checkpoints", 2, 4, latest=4)
    other = steps(tmp_path / "other", 2)
    roll_back(root, other / "step-000000002", 2)
    assert latest_step(root) == 4 and not list(root.glob("*.abandoned-*"))


def test_train_s_own_entries_are_told_from_other_files(tmp_path):
    root = steps(tmp_path / "checkpoints", 2, latest=2)
    own = ["step-000000001.corrupt-20261122-161500", "step-000000003.abandoned-20261122-161500~1",
           ".tmp-step-000000004", ".replaced-step-000000002-77", ".latest.tmp-12"]
    for name in own:
        (root / name).mkdir()
    for name in ("notes.txt", "step-2-mine", "other-tool"):
        (root / name).mkdir()
    (root / "step-000000009").symlink_to(tmp_path)
    assert [p.name for p in written_by_train(root)] == sorted(
        [*own, "latest", "step-000000002"])


def test_what_a_resume_may_change_is_read_from_the_config_fields():
    # The rule sits on each field (schema.py: resumable=True); a new field is another
    # run's setting unless it says otherwise. A refusal names the flags as `train` has them.
    from workload.checkpoint.resuming import differences
    from workload.config import MAY_CHANGE_ON_RESUME, TrainConfig

    run = TrainConfig().to_dict()
    assert {"epochs", "max_steps", "output_dir", "dist_timeout_s", "resume", "overwrite",
            "recipe"} <= MAY_CHANGE_ON_RESUME
    assert not {"batch_size", "model", "seed", "strategy"} & MAY_CHANGE_ON_RESUME
    assert differences(run, dict(run, epochs=7, dist_timeout_s=5.0)) == ""
    assert differences(run, dict(run, model="resnet18", batch_size=8)) == (
        "--batch-size 256 there, 8 now, --model 'wrn' there, 'resnet18' now")
