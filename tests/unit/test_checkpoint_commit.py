"""A checkpoint's commit counted in system calls (issue 62): on a parallel file system each
fsync and rename is a round trip to the metadata server, so their number and how many of
them the save waits for one after another are its fixed cost. Counted by wrapping os.fsync
and the renames in this process, for the synchronous save and the writer process's half
(run here), and the crash state the single fsync of checkpoints/ newly allows."""

from __future__ import annotations

import os
import threading

import pytest
import torch

from workload.checkpoint.background import Stage
from workload.checkpoint.writer.folder import newest_loadable, step_name
from workload.checkpoint.inprocess import save_checkpoint
from workload.checkpoint.writer.store import Snapshot, verify
from workload.checkpoint.writer.process import Buffer
from workload.checkpoint.writer.process import _save as _commit


def snapshot(step: int) -> Snapshot:
    model = {"w": torch.full((300,), float(step))}
    optimizer = {"state": {0: {"momentum_buffer": torch.ones(300)}},
                 "param_groups": [{"lr": 0.1, "params": [0]}]}
    trainer = dict(step=step, epoch=0, batch=step, world_size=1)
    return Snapshot(model, optimizer, trainer, [{"torch": torch.get_rng_state()}], {"seed": 1})


def save_in_process(root, step: int) -> None:
    save_checkpoint(root, snapshot(step), keep=1, is_main=True)


def save_by_writer(root, step: int) -> None:
    """The writer process's half of an asynchronous save, run in this process."""
    stage, buffer = Stage(), Buffer()
    try:
        request = stage.copy_in(snapshot(step))
        root.mkdir(parents=True, exist_ok=True)
        tmp = root / f".tmp-{step_name(step)}"
        tmp.mkdir(mode=0o700)
        request.update(root=str(root), tmp=str(tmp), keep=1)
        _commit(request, buffer, lambda saved: None)
    finally:
        buffer.close()
        stage.drop()


def counted(monkeypatch, save, root, step: int) -> tuple[list, list]:
    """(fsyncs as (what was synced, whether on the saving thread), renames) of one save."""
    syncs, renames, real = [], [], {name: getattr(os, name) for name in
                                    ("fsync", "rename", "replace")}
    saver = threading.current_thread()

    def fsync(fd):
        syncs.append((os.readlink(f"/proc/self/fd/{fd}"), threading.current_thread() is saver))
        return real["fsync"](fd)

    def renaming(name):
        def rename(*args, **kwargs):
            renames.append(args[1])
            return real[name](*args, **kwargs)
        return rename

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "rename", renaming("rename"))
    monkeypatch.setattr(os, "replace", renaming("replace"))
    save(root, step)
    monkeypatch.undo()
    return syncs, renames


@pytest.mark.parametrize("save", [save_in_process, save_by_writer], ids=["sync", "writer"])
def test_a_commit_syncs_checkpoints_once_and_its_files_at_once(tmp_path, monkeypatch, save):
    """A save after another (so `latest` is replaced and the older step pruned) costs one
    fsync per file and one of its folder, issued together off the saving thread, then the
    folder's rename, `latest`'s (its content fsynced), and one fsync of checkpoints/ for
    both: 2 fsyncs waited for one after another, where there were 12 before issue 62."""
    root = tmp_path / "checkpoints"
    save(root, 1)
    syncs, renames = counted(monkeypatch, save, root, 2)
    path = root / step_name(2)
    files = len(verify(path)["files"]) + 1  # the manifest too
    assert len(syncs) == files + 3, syncs  # the step's folder, `latest`, checkpoints/
    assert [synced for synced, _ in syncs].count(str(root)) == 1, syncs
    on_saving_thread = [synced for synced, here in syncs if here]
    assert len(on_saving_thread) == 2, syncs  # `latest`'s content, then checkpoints/
    assert on_saving_thread[-1] == str(root)
    assert [os.path.basename(name) for name in renames] == [path.name, "latest"]
    assert (root / "latest").read_text() == f"{path.name}\n"


def test_a_crash_that_kept_latest_s_rename_but_not_the_folder_s_resumes_the_step_before(
        tmp_path):
    """With one fsync of checkpoints/ for both renames, a file system that keeps no order
    between them may, after a crash before that fsync, hold the new `latest` without the
    folder's rename: the step before (not pruned until after the fsync) is resumed, the
    unrenamed folder moved aside as unfinished (folder.publish's reasoning)."""
    root = tmp_path / "checkpoints"
    save_checkpoint(root, snapshot(1), keep=1, is_main=True)
    # The state such a crash leaves: step 2 written whole, `latest` naming it, its folder
    # still at its temporary name, step 1 still there.
    save_checkpoint(tmp_path / "other", snapshot(2), keep=1, is_main=True)
    os.rename(tmp_path / "other" / step_name(2), root / f".tmp-{step_name(2)}")
    (root / "latest").write_text(f"{step_name(2)}\n")
    resumed = newest_loadable(root, lambda path: (path, verify(path)))
    assert resumed[0] == root / step_name(1)
    assert not (root / f".tmp-{step_name(2)}").exists()
    assert len(list(root.glob(f"{step_name(2)}.incomplete-*"))) == 1
