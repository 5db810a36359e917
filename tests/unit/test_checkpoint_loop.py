"""workload.checkpoint.Checkpoints in one process, no process group: its arguments
refused in one line naming the value and the fix, the lock, and a save read back into
fresh objects. (Two gloo ranks, kill -9 and preemption: tests/e2e/test_checkpoint_own_loop.py.)"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
import torch
from torch import nn

from tests.helpers import clean_env, tmpfs
from workload.checkpoint import Checkpoints
from workload.checkpoint.writer.folder import complete_steps
from workload.errors import UsageError


def parts(seed: int = 0) -> dict:
    torch.manual_seed(seed)
    model = nn.Linear(4, 2)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2)
    return dict(model=model, optimizer=optimizer, scheduler=scheduler)


def train(objects: dict, steps: int) -> None:
    for _ in range(steps):
        objects["model"](torch.ones(3, 4)).square().mean().backward()
        objects["optimizer"].step()
        objects["optimizer"].zero_grad()
        objects["scheduler"].step()


def refused(call, *words: str) -> str:
    with pytest.raises(UsageError) as caught:
        call()
    message = str(caught.value)
    assert "\n" not in message and all(word in message for word in words), message
    return message


@pytest.fixture
def ckpt(tmp_path):
    opened = Checkpoints(tmp_path / "run", async_save=False)  # no writer process to start
    yield opened
    opened.close()


def test_a_file_where_the_folder_should_be_is_refused_naming_it(tmp_path):
    (tmp_path / "notes.txt").write_text("mine\n")
    refused(lambda: Checkpoints(tmp_path / "notes.txt"), "notes.txt is a file, not a folder",
            "pass a folder you can write")
    assert (tmp_path / "notes.txt").read_text() == "mine\n"


@pytest.mark.parametrize("folder", [None, 3, ""])
def test_a_folder_that_is_no_path_is_refused_naming_it(folder):
    refused(lambda: Checkpoints(folder), f"folder {folder!r} is not a path",
            "Checkpoints('runs/mine')")


@pytest.mark.parametrize("value", [1, "yes", None])
def test_async_save_must_be_a_switch(tmp_path, value):
    refused(lambda: Checkpoints(tmp_path, async_save=value), f"async_save={value!r} is not "
            "True or False")


@pytest.mark.parametrize("keep", [0, -2, 1.5, True])
def test_keep_must_be_a_count(tmp_path, keep):
    refused(lambda: Checkpoints(tmp_path, keep=keep), f"keep={keep!r}", "e.g. keep=3")


@pytest.mark.parametrize("step", [-1, 2.0, "3", None])
def test_a_step_that_is_no_count_is_refused_naming_it(ckpt, step):
    refused(lambda: ckpt.save(step, **parts()), f"step {step!r} is not a whole number",
            "the number resume() returns")
    assert not (ckpt.root).exists() or not any(ckpt.root.iterdir())


@pytest.mark.parametrize("extra, why", [
    ({"epoch": 1, "sampler": object()}, "not JSON serializable"),
    ({"loss": float("nan")}, "Out of range float"),
    ([1, 2], "is not a dict"),
])
def test_extra_that_json_cannot_hold_is_refused_naming_it(ckpt, extra, why):
    message = refused(lambda: ckpt.save(1, **parts(), extra=extra), "extra=", why,
                      "JSON values")
    assert repr(extra)[:20] in message
    assert not (ckpt.root).exists() or not any(ckpt.root.iterdir())


def test_a_second_writer_is_refused_until_the_first_closes(tmp_path):
    first = Checkpoints(tmp_path)
    refused(lambda: Checkpoints(tmp_path), f"Checkpoints(folder) {tmp_path} is in use by "
            "another run", "pass another Checkpoints(folder)")
    first.close()
    Checkpoints(tmp_path).close()
    refused(lambda: first.save(1, **parts()), "save() after close()")


def test_a_new_folder_resumes_at_step_0(ckpt):
    assert ckpt.resume(**parts()) == 0 and ckpt.extra == {}


def test_a_save_resumes_into_fresh_objects_with_its_extra(ckpt):
    round_trip(ckpt)


def test_an_asynchronous_save_resumes_the_same(tmp_path, capsys):
    with Checkpoints(tmp_path, async_save=True) as ckpt:
        round_trip(ckpt)
        # The buffer has no name while in use: a kill -9 of either process leaves nothing
        # behind in /dev/shm (its memory goes with the last process that maps it).
        named = [p for folder in (Path("/dev/shm"), Path(tempfile.gettempdir()))
                 for p in folder.glob(f"hpc-train-staging-{os.getpid()}-*")]
        assert named == []
    assert capsys.readouterr().out.count("checkpoint staging buffer:") == 1
    assert not list(tmp_path.glob("checkpoints/.tmp-*"))


def test_a_first_save_from_a_thread_that_ends_keeps_the_writer(tmp_path):
    """The writer dies with the training process, not with the thread that started it:
    a loop may save from a thread of its own (Linux's parent-death signal follows the
    thread that forked, so a writer tied to it died when that thread ended)."""
    objects = parts()

    def save_and_wait():  # the writer has long been set up when its first answer comes
        ckpt.save(1, **objects)
        ckpt.wait()

    with Checkpoints(tmp_path, async_save=True, keep=3) as ckpt:
        saver = threading.Thread(target=save_and_wait)
        saver.start()
        saver.join()
        time.sleep(0.5)  # a writer killed with the thread is gone by now
        ckpt.save(2, **objects)
        ckpt.wait()
    assert [step for step, _ in complete_steps(tmp_path / "checkpoints")] == [1, 2]


def round_trip(ckpt):
    saved = parts()
    train(saved, 3)
    ckpt.save(3, **saved, extra={"epoch": 1, "batch": [2, 5]})
    fresh = parts(seed=7)
    assert ckpt.resume(**fresh) == 3 and ckpt.extra == {"epoch": 1, "batch": [2, 5]}
    assert torch.equal(fresh["model"].weight, saved["model"].weight)
    assert fresh["scheduler"].state_dict() == saved["scheduler"].state_dict()
    train(saved, 2)
    train(fresh, 2)  # the optimizer's moments came back too
    assert torch.equal(fresh["model"].weight, saved["model"].weight)


def test_a_resume_with_other_parts_is_refused_and_nothing_moves(ckpt):
    ckpt.save(2, **parts())
    without = parts()
    del without["scheduler"]
    refused(lambda: ckpt.resume(**without), "belongs to another training loop",
            "this resume passes ['model', 'optimizer']", "nothing was moved")
    other = dict(parts(), model=nn.Linear(4, 3))
    other["optimizer"] = torch.optim.Adam(other["model"].parameters())
    other["scheduler"] = torch.optim.lr_scheduler.StepLR(other["optimizer"], step_size=2)
    refused(lambda: ckpt.resume(**other), "other names or shapes")
    assert sorted(p.name for p in ckpt.root.iterdir()) == ["latest", "step-000000002"]


def test_a_schedule_stepped_per_epoch_resumes(ckpt):
    # train's own check (its schedule steps with every optimizer step) is not a loop's
    stepped = parts()
    train(stepped, 2)  # two epochs' schedule steps, say, after 40 optimizer steps
    ckpt.save(40, **stepped)
    assert ckpt.resume(**parts()) == 40


@pytest.mark.root
@pytest.mark.slow  # starts the writer process
def test_a_full_disk_in_the_writer_is_one_line_and_the_previous_checkpoint_stays(tmp_path):
    with tmpfs(tmp_path / "tmpfs", "size=256k") as folder:
        ckpt = Checkpoints(folder / "run", async_save=True)
        ckpt.save(1, **parts())
        big = nn.Linear(1000, 100)  # 400 kB of weights: more than is left
        ckpt.save(2, model=big, optimizer=torch.optim.SGD(big.parameters()))
        message = refused(ckpt.close, "no space left to save a checkpoint in", "MiB free")
        assert sorted(p.name for p in ckpt.root.iterdir()) == ["latest", "step-000000001"]
        with Checkpoints(folder / "run") as again:
            assert again.resume(**parts()) == 1, message


@pytest.mark.root
@pytest.mark.slow  # a child Python with torch
def test_no_room_for_the_staging_buffer_saves_synchronously_with_one_line(tmp_path):
    """A /dev/shm too small for the state (Docker's is 64 MB): the mapped buffer would
    kill the process with SIGBUS at the first page written past the room there is."""
    code = ("import sys, torch\n"
            "from pathlib import Path\n"
            "from torch import nn\n"
            "from workload.checkpoint import Checkpoints, background\n"
            "background.STAGING_FOLDERS = (Path(sys.argv[1]),)\n"
            "model = nn.Linear(1000, 1000)  # 4 MB of weights, the tmpfs holds 1 MB\n"
            "optimizer = torch.optim.SGD(model.parameters())\n"
            "with Checkpoints(sys.argv[2]) as ckpt:\n"
            "    ckpt.save(1, model=model, optimizer=optimizer)\n"
            "    ckpt.save(2, model=model, optimizer=optimizer)\n"
            "with Checkpoints(sys.argv[2]) as ckpt:\n"
            "    print('resumed', ckpt.resume(model=model, optimizer=optimizer))\n")
    with tmpfs(tmp_path / "shm", "size=1m") as shm:
        done = subprocess.run([sys.executable, "-c", code, str(shm), str(tmp_path / "run")],
                              capture_output=True, text=True, timeout=300, env=clean_env())
        assert done.returncode == 0, done.stderr[-3000:]
        assert list(shm.iterdir()) == [], "nothing is left in the full folder"
    assert "resumed 2" in done.stdout
    said = [line for line in done.stderr.splitlines() if "staging buffer" in line]
    assert len(said) == 1 and "saving synchronously" in said[0] and "--shm-size" in said[0]


def test_wait_after_close_is_refused(ckpt):
    ckpt.wait()  # nothing in flight
    ckpt.close()
    refused(ckpt.wait, "wait() after close()")


@pytest.mark.slow  # starts the writer process
def test_leaving_on_an_exception_commits_the_save_in_flight_and_keeps_the_error(tmp_path):
    with pytest.raises(KeyError, match="the loop's own"):
        with Checkpoints(tmp_path) as ckpt:
            ckpt.save(1, **parts())
            raise KeyError("the loop's own")
    with Checkpoints(tmp_path) as again:
        assert again.resume(**parts()) == 1


def nested(levels: int):
    value = 1
    for _ in range(levels):
        value = {"a": value}
    return value


class Unshowable(dict):
    def __repr__(self):
        raise RuntimeError("a repr that fails")


def test_what_no_resume_could_read_is_refused_at_the_save(ckpt):
    """The reader's limits (nesting, counts) apply at the save: a save never writes a
    checkpoint that every resume would move aside as corrupt."""
    refused(lambda: ckpt.save(1, **parts(), extra={"deep": nested(30)}),
            "is nested too deeply for a checkpoint to read back")
    refused(lambda: ckpt.save(2**70, **parts()), "step 1180591620717411303424 is not a "
            "whole number", "up to 2^62")
    assert not ckpt.root.exists() or not any(ckpt.root.iterdir())
    ckpt.save(1, **parts(), extra={"deep": nested(20)})
    assert ckpt.resume(**parts()) == 1 and ckpt.extra == {"deep": nested(20)}


@pytest.mark.parametrize("extra", [Unshowable(a=object()), Unshowable(a=float("inf"))])
def test_extra_whose_repr_fails_is_refused_in_one_line(ckpt, extra):
    refused(lambda: ckpt.save(1, **parts(), extra=extra),
            "extra=<a Unshowable whose repr() fails> is not JSON-able")


@pytest.mark.parametrize("call", ["save", "resume"])
@pytest.mark.parametrize("name, value, words", [
    ("model", object(), "model=<object object at"),
    ("model", None, "model=None is not a torch.nn.Module"),
    ("optimizer", "adam", "optimizer='adam' is not a torch optimizer"),
    ("scheduler", object(), "has no state_dict() and load_state_dict()"),
    ("scaler", 3, "scaler=3 has no state_dict()"),
])
def test_objects_without_a_state_are_refused_in_one_line(ckpt, call, name, value, words):
    objects = dict(parts(), **{name: value})
    arguments = (1,) if call == "save" else ()
    refused(lambda: getattr(ckpt, call)(*arguments, **objects), f"Checkpoints.{call}:",
            words)


def test_a_folder_with_a_newline_is_refused_and_nothing_is_made(tmp_path):
    refused(lambda: Checkpoints(tmp_path / "run\nx"), "run\\nx", "control character")
    assert list(tmp_path.iterdir()) == []


def test_numpy_and_torch_whole_numbers_are_steps(ckpt):
    import numpy as np

    ckpt.save(np.int64(3), **parts())
    ckpt.save(torch.tensor(4), **parts())
    assert ckpt.resume(**parts()) == 4
    assert [step for step, _ in complete_steps(ckpt.root)] == [3, 4]
    Checkpoints(ckpt.folder.parent / "other", keep=np.int64(2)).close()


def test_a_save_before_resume_or_of_an_earlier_step_is_refused(tmp_path):
    with Checkpoints(tmp_path, async_save=False) as first:
        first.save(4, **parts())
        refused(lambda: first.save(2, **parts()), "step 2 is before step 4", "(nothing was "
                "written)")
        first.save(4, **parts())  # the same step again: the same timeline
    with Checkpoints(tmp_path, async_save=False) as second:
        refused(lambda: second.save(1, **parts()), "holds checkpoints (the newest at step 4)",
                "call ckpt.resume(")
        assert second.resume(**parts()) == 4
        refused(lambda: second.save(3, **parts()), "step 3 is before step 4")
        second.save(5, **parts())
    assert [step for step, _ in complete_steps(tmp_path / "checkpoints")] == [4, 5]


@pytest.mark.parametrize("extra,named", [
    ({"seen": {1: "done"}}, "extra['seen'] has the key 1 (int), which JSON gives back as "
                            "the string '1'"),
    ({"position": (3, 7)}, "extra['position'] is a tuple, which JSON gives back as a list"),
    ({"done": [0, {"at": (1,)}]}, "extra['done'][1]['at'] is a tuple")])
def test_an_extra_json_would_give_back_changed_is_refused_naming_where(ckpt, extra, named):
    """M2 (issue 59): integer keys came back as strings and tuples as lists, silently."""
    refused(lambda: ckpt.save(1, **parts(), extra=extra), named,
            "a resume would not give `extra` back as saved")
    assert not ckpt.root.exists() or not any(ckpt.root.iterdir())


def test_a_resume_over_an_edited_optimizer_setting_says_so_one_line_each(ckpt, caplog):
    """M1 (issue 59): resume silently put the checkpoint's learning rate and betas back
    over the ones the loop was edited to between jobs."""
    saved = parts()
    ckpt.save(1, **saved)
    edited = parts()
    edited["optimizer"].param_groups[0].update(lr=0.05, betas=(0.8, 0.99))
    with caplog.at_level("WARNING"):
        assert ckpt.resume(**edited) == 1
    lines = [r.getMessage() for r in caplog.records if "Checkpoints.resume" in r.getMessage()]
    assert lines == [
        "Checkpoints.resume: the optimizer's betas is (0.8, 0.99) in this loop (group 0) and "
        "(0.9, 0.999) in step-000000001: the checkpoint's is restored; to train on with the "
        "loop's, set it after resume(), e.g. optimizer.param_groups[0]['betas'] = (0.8, 0.99)",
        "Checkpoints.resume: the optimizer's lr is 0.05 in this loop (group 0) and 0.01 in "
        "step-000000001: the checkpoint's is restored; to train on with the loop's, set it "
        "after resume(), e.g. optimizer.param_groups[0]['lr'] = 0.05"]
    assert edited["optimizer"].param_groups[0]["lr"] == 0.01
    caplog.clear()
    ckpt.resume(**parts())  # as saved: nothing to say
    assert not [r for r in caplog.records if "Checkpoints.resume" in r.getMessage()]


def test_a_collective_call_on_one_rank_only_is_named_not_waited_for(monkeypatch, caplog):
    """H2 (issue 59), the kind: every collective call of Checkpoints meets the others'
    through the store first (torch's own HashStore here, two ranks as two threads): the
    same call is waited for, another call at the same place is refused at once on both
    ranks, and a call the other rank never makes is named by rank 0 within SAY_AFTER_S
    and raised at the store's (the process group's) timeout."""
    from datetime import timedelta

    from torch.distributed import HashStore

    from workload.checkpoint import meeting

    store = HashStore()
    store.set_timeout(timedelta(seconds=1.5))
    ranks = [meeting.Meeting("runs/mine", rank, 2, store) for rank in (0, 1)]
    ranks[1].prefix = ranks[0].prefix  # one object per rank, each in its own process

    def on_both(zero, one) -> list:
        found = [None, None]

        def call(rank, how):
            try:
                how(ranks[rank])
            except UsageError as error:
                found[rank] = str(error)
        threads = [threading.Thread(target=call, args=pair) for pair in ((0, zero), (1, one))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=30)
        return found

    assert on_both(lambda m: m.meet("save", "of step 2"),
                   lambda m: m.meet("save", "of step 2")) == [None, None]
    zero, one = on_both(lambda m: m.meet("save", "of step 4"), lambda m: m.meet("wait"))
    assert zero == ("Checkpoints.save: rank 1 called wait() where rank 0 called save(): save "
                    "is a collective: call it on every rank, in the same order (not under "
                    "`if rank == 0:`)")
    assert one.startswith("Checkpoints.wait: rank 0 called save() where rank 1 called wait()")
    monkeypatch.setattr(meeting, "SAY_AFTER_S", 0.5)
    with caplog.at_level("WARNING"):
        zero, _ = on_both(lambda m: m.meet("save", "of step 6"), lambda m: None)
    assert re.search(r"Checkpoints\.save: save is a collective: call it on every rank \(not "
                     r"under `if rank == 0:`\); rank 0 has waited [01] s in the save of step 6 "
                     r"for rank 1 to call it too", caplog.text), caplog.text
    assert zero.startswith("Checkpoints.save: save is a collective") and zero.endswith(
        "gave up after the process group's timeout (2 s)")
