"""The run folder's lock on its own: one holder, a second refused naming it, stale locks
(a dead process here, a stopped heartbeat elsewhere) taken over. No torch, no training."""

from __future__ import annotations

import errno
import json
import os
import socket
import subprocess
import sys
import time

import pytest

from workload.checkpoint import lock as run_lock
from workload.checkpoint.lock import STALE_AFTER_S, RunLock
from workload.runfolder import LOCK as LOCK_NAME


def write_lock(folder, **holder) -> None:
    (folder / LOCK_NAME).write_text(json.dumps(holder))


def test_one_holder_and_a_second_refused_naming_it(tmp_path, monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    first = RunLock(tmp_path)
    assert first.acquire() is None
    refusal = RunLock(tmp_path).acquire()
    assert refusal is not None
    for words in (socket.gethostname(), f"PID {os.getpid()}", "SLURM job 4242",
                  "--output-dir", str(tmp_path / LOCK_NAME)):
        assert words in refusal
    first.release()
    assert not (tmp_path / LOCK_NAME).exists()
    again = RunLock(tmp_path)
    assert again.acquire() is None
    again.release()


def test_a_live_process_on_this_host_keeps_its_lock(tmp_path):
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        write_lock(tmp_path, host=socket.gethostname(), pid=sleeper.pid,
                   pid_start=run_lock._start_time(sleeper.pid), pid_ns=run_lock._pid_namespace())
        refusal = RunLock(tmp_path).acquire()
        assert refusal is not None and f"PID {sleeper.pid}" in refusal
    finally:
        sleeper.kill()
        sleeper.wait()
    # The same PID gone: stale, taken over at once.
    lock = RunLock(tmp_path)
    assert lock.acquire() is None
    assert json.loads((tmp_path / LOCK_NAME).read_text())["pid"] == os.getpid()
    lock.release()


def test_a_reused_pid_does_not_keep_a_dead_run_s_lock(tmp_path):
    write_lock(tmp_path, host=socket.gethostname(), pid=os.getpid(), pid_start="1",
               pid_ns=run_lock._pid_namespace())
    lock = RunLock(tmp_path)
    assert lock.acquire() is None
    lock.release()


def test_another_host_s_lock_is_stale_only_when_its_heartbeat_stopped(tmp_path):
    write_lock(tmp_path, host="other-node", pid=1, job_id="7")
    refusal = RunLock(tmp_path).acquire()
    assert refusal is not None and "other-node" in refusal and "SLURM job 7" in refusal
    old = time.time() - STALE_AFTER_S - 60
    os.utime(tmp_path / LOCK_NAME, (old, old))
    lock = RunLock(tmp_path)
    assert lock.acquire() is None
    lock.release()


def test_an_ended_step_of_this_job_holds_no_lock_after_a_restart(tmp_path, monkeypatch):
    """A step restarted in the allocation after a node was lost: the lost rank 0's lock,
    on another host, is taken over at once (the job script says the step ended), and
    only then: a live step of this job or another job's keep theirs."""
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    monkeypatch.setenv("SLURM_STEP_ID", "1")
    for holder, ended, taken in [(dict(job_id="7", step_id="0"), "1", True),
                                 (dict(job_id="7", step_id="0"), "", False),
                                 (dict(job_id="8", step_id="0"), "1", False),
                                 (dict(job_id="7", step_id="1"), "1", False)]:
        monkeypatch.setenv("TRAIN_PREVIOUS_STEP_ENDED", ended)
        write_lock(tmp_path, host="lost-node", pid=1, **holder)
        lock = RunLock(tmp_path)
        assert (lock.acquire() is None) == taken, holder
        if taken:
            lock.release()
        (tmp_path / LOCK_NAME).unlink(missing_ok=True)


def test_the_holder_refreshes_its_heartbeat(tmp_path, monkeypatch):
    monkeypatch.setattr(run_lock, "HEARTBEAT_S", 0.05)
    lock = RunLock(tmp_path)
    assert lock.acquire() is None
    old = time.time() - 1000
    os.utime(tmp_path / LOCK_NAME, (old, old))
    deadline = time.monotonic() + 30  # the heartbeat thread runs every 0.05 s
    while time.time() - (tmp_path / LOCK_NAME).stat().st_mtime > 100:
        assert time.monotonic() < deadline, "the holder never refreshed its heartbeat"
        time.sleep(0.05)
    lock.release()


def test_release_leaves_a_lock_taken_over_by_another(tmp_path):
    lock = RunLock(tmp_path)
    assert lock.acquire() is None
    write_lock(tmp_path, host="other-node", pid=1, token="not-mine")
    lock.release()
    assert (tmp_path / LOCK_NAME).exists()


@pytest.mark.parametrize("content", ["", "{half a"])
def test_a_lock_being_written_is_respected(tmp_path, content):
    (tmp_path / LOCK_NAME).write_text(content)
    assert RunLock(tmp_path).acquire() is not None


def test_a_garbage_lock_file_is_named_as_such_with_what_to_do(tmp_path):
    (tmp_path / LOCK_NAME).write_bytes(b"\x00\xffnot a lock")
    refusal = RunLock(tmp_path).acquire()
    assert refusal is not None and "?" not in refusal
    assert "not a lock file train wrote" in refusal and str(tmp_path / LOCK_NAME) in refusal
    assert f"rm {tmp_path / LOCK_NAME}" in refusal


def test_a_folder_named_train_lock_is_refused_in_one_line(tmp_path):
    (tmp_path / LOCK_NAME).mkdir()
    refusal = RunLock(tmp_path).acquire()
    assert refusal is not None and len(refusal.splitlines()) == 1
    assert f"{tmp_path / LOCK_NAME} is a folder, not the lock file" in refusal
    assert (tmp_path / LOCK_NAME).is_dir(), "never removed"


def dead_holder() -> dict:
    """A lock's content whose holder has ended on this host: stale at once."""
    return dict(host=socket.gethostname(), pid=os.getpid(), pid_start="1",
                pid_ns=run_lock._pid_namespace(), token="dead")


@pytest.mark.timeout(60)
def test_a_fifo_at_the_lock_s_name_is_refused_in_one_line_not_waited_on(tmp_path):
    """A neighbour with write access to the run folder puts a FIFO at train.lock: reading
    it by its name waited for a writer forever, before any line."""
    os.mkfifo(tmp_path / LOCK_NAME)
    refusal = RunLock(tmp_path).acquire()
    assert refusal is not None and len(refusal.splitlines()) == 1
    assert f"{tmp_path / LOCK_NAME} is a FIFO, not the lock file train keeps there" in refusal


def test_a_link_at_the_lock_s_name_is_refused_not_read_through(tmp_path):
    """The lock is a file of its own: a symbolic link there is a neighbour's, whatever the
    file it leads to says (here a dead holder's lock, which was taken over)."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_text(json.dumps(dead_holder()))
    run = tmp_path / "run"
    run.mkdir()
    (run / LOCK_NAME).symlink_to(elsewhere)
    refusal = RunLock(run).acquire()
    assert refusal is not None and f"{run / LOCK_NAME} is a symbolic link" in refusal
    assert (run / LOCK_NAME).is_symlink() and json.loads(elsewhere.read_text())["token"] == "dead"


def test_a_stale_lock_replaced_after_it_was_judged_is_put_back(tmp_path, monkeypatch):
    """Between judging a lock stale and renaming it away, another file took its name
    (another run's takeover, a neighbour's swap) with the very same bytes: the file
    renamed is told by its identity, so the newcomer is put back, not removed."""
    write_lock(tmp_path, **dead_holder())
    path, breaks = tmp_path / LOCK_NAME, run_lock._break

    def swapped_first(lock, judged):
        content = path.read_bytes()
        path.unlink()
        path.write_bytes(content)  # a new file of the same content
        breaks(lock, judged)

    monkeypatch.setattr(run_lock, "_break", swapped_first)
    refusal = RunLock(tmp_path).acquire()
    assert refusal is not None and "keeps changing hands" in refusal
    assert json.loads(path.read_text())["token"] == "dead"


@pytest.mark.parametrize("code", [errno.EPERM, errno.EOPNOTSUPP, errno.EXDEV, errno.ENOSYS])
def test_a_file_system_without_hard_links_is_named_with_the_fix(tmp_path, monkeypatch, code):
    def no_links(src, dst, *args, **kwargs):
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(run_lock.os, "link", no_links)
    refusal = RunLock(tmp_path).acquire()
    assert refusal is not None and "hard links" in refusal and "--output-dir" in refusal
    assert "keeps changing hands" not in refusal
    assert list(tmp_path.iterdir()) == [], "no draft left behind"
