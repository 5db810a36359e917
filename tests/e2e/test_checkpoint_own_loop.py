"""A user's own DDP loop with workload.checkpoint.Checkpoints: examples/plain_ddp.py as two
gloo ranks on the CPU, started by hand with the torch.distributed variables (as a user
would). Killed with SIGKILL mid-run, it resumes to the uninterrupted run's weights; a
damaged newest checkpoint falls back to the one before with one line; a second process
on the folder is refused in one line; a preemption saves, exits 75 on both ranks, and
the resumed run ends with the same weights again. The example saves asynchronously (the
default): SIGTERM to both ranks and the writer with a save in flight commits it, and a
killed writer stops the run, which resumes from a committed checkpoint; both end with
the same weights. An FSDP2 loop (tests/scripts/own_loop_fsdp.py) writes every rank's
shard and resumes to the same weights too.

Fewer torch processes (about 3 CPU-seconds each): a stop's resumed run is itself the next
stop's run (a killed writer, then SIGKILL; USR2 to one rank, then SIGTERM with a save in
flight), so each chain ends in one uninterrupted-length run compared with the reference;
the damaged checkpoint is the reference run's newest, in a copy; the one-process loop's
6-step folder is one run that its tests copy.
"""

from __future__ import annotations

import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import (REPO, TESTS, clean_env, free_ports, pickles_and_zips,
                           started_writer_of, writer_of)
from tests.helpers.ranks import start_logged_ranks
from workload.files import proc_stat_fields
from workload.checkpoint.writer.folder import complete_steps, latest_step

pytestmark = pytest.mark.slow

EXAMPLE = REPO / "examples" / "plain_ddp.py"
FSDP_LOOP = TESTS / "scripts" / "own_loop_fsdp.py"
STEPS, EVERY = 24, 4
STEP_S = 0.3  # per step where the test must act while the run trains


def start_example(out: Path, logs: Path, *args: str, steps: int = STEPS) -> list:
    """Two ranks of the example, each writing its output to logs/rank-N.log."""
    return start_logged_ranks([sys.executable, str(EXAMPLE), "--steps", str(steps),
                               "--save-every", str(EVERY), *args, "--output-dir", str(out)],
                              logs)


def output(logs: Path) -> str:
    return "".join(log.read_text() for log in sorted(logs.glob("rank-*.log")))


def finish(procs: list, logs: Path) -> str:
    """Both ranks' output, once they ended (killed, with their output, after 3 minutes)."""
    try:
        for proc in procs:
            proc.wait(timeout=180)
    except subprocess.TimeoutExpired:
        for proc in procs:
            proc.kill()
            proc.wait()
        raise AssertionError(f"a rank did not end:\n{output(logs)[-4000:]}") from None
    return output(logs)


def run_ranks(out: Path, logs: Path, *args: str, steps: int = STEPS) -> str:
    procs = start_example(out, logs, *args, steps=steps)
    text = finish(procs, logs)
    assert [p.returncode for p in procs] == [0, 0], text[-4000:]
    return text


def weights(text: str) -> str:
    return re.search(rf"^done: {STEPS} steps on 2 processes, .* weights (\w+)$", text,
                     re.M).group(1)


def wait_for(logs: Path, line: str, procs: list) -> None:
    deadline = time.monotonic() + 120
    while line not in output(logs):
        assert time.monotonic() < deadline and all(p.poll() is None for p in procs), (
            f"no {line!r}:\n{output(logs)[-4000:]}")
        time.sleep(0.1)


@pytest.fixture(scope="module")
def uninterrupted_run(tmp_path_factory) -> tuple[str, Path]:
    """A run of STEPS steps that nothing stopped: its weights and its folder (which the
    damaged-checkpoint test copies rather than train 12 steps of its own)."""
    folder = tmp_path_factory.mktemp("uninterrupted")
    return weights(run_ranks(folder / "run", folder / "logs")), folder / "run"


@pytest.fixture(scope="module")
def uninterrupted(uninterrupted_run) -> str:
    """The weights of a run of STEPS steps that nothing stopped."""
    return uninterrupted_run[0]


def killed_mid_run(out: Path, logs: Path, after: int) -> int:
    """Start the run on `out` (resuming, if it holds checkpoints) and SIGKILL both ranks
    anywhere up to a save past `after`'s second save; the step `latest` names then."""
    procs = start_example(out, logs, "--step-time", str(STEP_S))
    wait_for(logs, f"saved checkpoint at step {after + 2 * EVERY}", procs)
    time.sleep(random.uniform(0, EVERY * STEP_S))  # anywhere up to the next save's end
    for proc in procs:
        proc.kill()
        proc.wait()
    # What `latest` names is committed: the kill may take the writer (it dies with the
    # loop) after a step folder is complete and before `latest` names it. The hand-over of
    # the second save waited for the first to commit.
    saved = latest_step(out / "checkpoints")
    assert saved is not None and saved >= after + EVERY
    return saved


def test_a_damaged_newest_checkpoint_falls_back_to_the_one_before(uninterrupted_run,
                                                                   tmp_path):
    weights_before, run = uninterrupted_run
    out = tmp_path / "run"
    shutil.copytree(run, out)  # checkpoints of steps 16, 20 and 24 (the newest 3 kept)
    newest = out / "checkpoints" / f"step-{STEPS:09d}" / "model.safetensors"
    data = bytearray(newest.read_bytes())
    data[-1] ^= 0xFF  # a weight's last byte: the file still parses, its sha256 differs
    newest.write_bytes(bytes(data))
    text = run_ranks(out, tmp_path / "second")
    why = [line for line in text.splitlines() if "skipping a bad checkpoint" in line]
    assert len(why) == 1 and f"step-{STEPS:09d}/model.safetensors does not match its " \
        "sha256" in why[0] and "resuming from the one before" in why[0], text[-3000:]
    assert f"resumed from step {STEPS - EVERY} " in text
    assert weights(text) == weights_before
    aside = [p.name for p in (out / "checkpoints").iterdir() if ".corrupt-" in p.name]
    assert len(aside) == 1 and aside[0].startswith(f"step-{STEPS:09d}.corrupt-")


def test_a_second_writer_is_refused_then_usr2_and_sigterm_mid_save_resume_exactly(
        uninterrupted, tmp_path):
    """Two stops of one run, each resumed by the next run (which the test needs anyway):
    USR2 to one rank, then SIGTERM to every process with a save in flight; the last run
    ends with the uninterrupted run's weights."""
    out, logs = tmp_path / "run", tmp_path / "first"
    procs = start_example(out, logs, "--step-time", str(STEP_S))
    wait_for(logs, "rank 1: training from step 0", procs)
    # The run is held (SIGSTOP) while the second process (a Python importing torch) is
    # refused, so that it still trains when the signal comes, however loaded the machine:
    # at 1 s a step, a suite's load let the 24 steps end first.
    for proc in procs:
        proc.send_signal(signal.SIGSTOP)
    try:
        second = subprocess.run(
            [sys.executable, str(EXAMPLE), "--steps", "2", "--output-dir", str(out)],
            capture_output=True, text=True, timeout=120, cwd=tmp_path,
            env={**clean_env(), "MASTER_PORT": str(free_ports(1)[0]), "OMP_NUM_THREADS": "1"})
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGCONT)
    last = second.stderr.strip().splitlines()[-1]
    assert second.returncode != 0 and "saved checkpoint" not in second.stdout
    assert f"Checkpoints(folder) {out} is in use by another run" in last, second.stderr
    assert f"PID {procs[0].pid}," in last and "pass another Checkpoints(folder)" in last
    procs[1].send_signal(signal.SIGUSR2)  # to rank 1 only: both stop at the same step
    text = finish(procs, logs)
    assert [p.returncode for p in procs] == [75, 75], text[-3000:]
    [step] = re.findall(r"^rank 1: preempted at step (\d+), exiting 75$", text, re.M)
    assert f"rank 0: preempted at step {step}, exiting 75" in text
    assert re.findall(r"^saved checkpoint at step (\d+)$", text, re.M)[-1] == step
    text = sigterm_with_a_save_in_flight(out, tmp_path / "requeued", after=int(step))
    assert f"resumed from step {step} " in text
    text = run_ranks(out, tmp_path / "requeued-again")
    assert weights(text) == uninterrupted


def test_an_fsdp2_loop_writes_every_rank_s_shard_and_resumes_exactly(tmp_path):
    """The run cut at step 6 is the whole run's folder as it stood then: its step-9
    checkpoint removed and `latest` naming step 6 (a 6-step run of its own would save the
    same files: the loop is deterministic)."""
    def run(out: Path, steps: int, logs: str) -> str:
        procs = start_logged_ranks([sys.executable, str(FSDP_LOOP), str(out), str(steps)],
                                   tmp_path / logs)
        text = finish(procs, tmp_path / logs)
        assert [p.returncode for p in procs] == [0, 0], text[-4000:]
        extras.append(sorted(re.findall(r"^rank \d resumed with extra .*$", text, re.M)))
        return re.search(r"^started at step (\d+), weights (\w+)$", text, re.M).groups()

    extras = []

    started, whole = run(tmp_path / "whole", 9, "whole")
    assert started == "0"
    shards = tmp_path / "whole" / "checkpoints" / "step-000000006" / "shards"
    assert sorted(p.name for p in shards.iterdir()) == [
        "rank-00000.json", "rank-00000.safetensors", "rank-00001.json",
        "rank-00001.safetensors"]
    cut = shutil.copytree(tmp_path / "whole", tmp_path / "cut") / "checkpoints"
    shutil.rmtree(cut / "step-000000009")
    (cut / "latest").write_text("step-000000006\n")
    assert run(tmp_path / "cut", 9, "resumed") == ("6", whole)
    assert extras[-1] == ["rank 0 resumed with extra {'rank': 0, 'batches': 6}",
                          "rank 1 resumed with extra {'rank': 1, 'batches': 6}"]  # its own


def wait_for_writer(procs: list) -> int:
    return started_writer_of(procs[0].pid)


def wait_until_exited(pid: int, timeout: float = 60.0) -> None:
    """Until process `pid` has exited (gone, or a zombie its parent has not reaped)."""
    deadline = time.monotonic() + timeout
    while (fields := proc_stat_fields(pid)) is not None and fields[0] != "Z":
        assert time.monotonic() < deadline, f"process {pid} still runs {timeout} s after SIGKILL"
        time.sleep(0.01)


def sigterm_with_a_save_in_flight(out: Path, logs: Path, after: int) -> str:
    """Start the run on `out` and SIGTERM both ranks and the writer (as SLURM signals a job
    step) once the first save past step `after` is handed to the writer: it commits, both
    ranks exit 75. The output of the run."""
    procs = start_example(out, logs, "--step-time", str(STEP_S))
    first = (after // EVERY + 1) * EVERY
    wait_for(logs, f"saved checkpoint at step {first}", procs)  # handed to the writer
    writer = wait_for_writer(procs)
    for pid in (writer, procs[0].pid, procs[1].pid):
        os.kill(pid, signal.SIGTERM)
    text = finish(procs, logs)
    assert [p.returncode for p in procs] == [75, 75], text[-3000:]
    [step] = re.findall(r"^rank 0: preempted at step (\d+), exiting 75$", text, re.M)
    steps = [s for s, _ in complete_steps(out / "checkpoints")]
    assert int(step) in steps and first in steps, (steps, text[-3000:])
    assert not list((out / "checkpoints").glob(".tmp-*")) and writer_of(procs[0].pid) is None
    return text


def test_a_killed_writer_then_sigkill_mid_run_each_resume_from_a_committed_checkpoint(
        uninterrupted, tmp_path):
    """Two stops of one run, each resumed by the next run: the writer killed, then both
    ranks killed (SIGKILL) mid-run; the last run ends with the uninterrupted weights."""
    out, logs = tmp_path / "run", tmp_path / "first"
    procs = start_example(out, logs, "--step-time", str(STEP_S))
    wait_for(logs, f"saved checkpoint at step {2 * EVERY}", procs)
    os.kill(wait_for_writer(procs), signal.SIGKILL)
    text = finish(procs, logs)
    assert all(p.returncode not in (0, 75) for p in procs), text[-3000:]
    assert "the checkpoint writer process died (killed by signal 9)" in text, text[-3000:]
    assert "rank 0's checkpoint save failed" in text and "done:" not in text
    # What `latest` names is committed: the writer may have died after a step folder was
    # complete and before `latest` named it (that folder is then left off the timeline).
    # The hand-over of step 2 * EVERY waited for the save of EVERY to commit.
    committed = latest_step(out / "checkpoints")
    assert committed is not None and committed >= EVERY, text[-3000:]
    saved = killed_mid_run(out, tmp_path / "resumed", after=committed)
    assert f"resumed from step {committed} " in output(tmp_path / "resumed")
    text = run_ranks(out, tmp_path / "resumed-again")
    assert re.search(rf"^resumed from step {saved} \({saved * 64 * 2} samples seen\)$", text,
                     re.M), text[-3000:]
    assert weights(text) == uninterrupted
    assert pickles_and_zips(out) == []


# --- a one-process loop as users edit theirs (tests/scripts/own_loop_small.py) -----------

SMALL_LOOP = TESTS / "scripts" / "own_loop_small.py"


def small_loop(folder: Path, steps: int, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SMALL_LOOP), str(folder), str(steps), *args],
                          capture_output=True, text=True, timeout=180, cwd=folder.parent,
                          env={**clean_env(), "OMP_NUM_THREADS": "1"})


def start_small_loop(tmp_path: Path, steps: int, *args: str) -> subprocess.Popen:
    """The loop in tmp_path/run, its output in tmp_path/logs/rank-0.log."""
    (tmp_path / "logs").mkdir()
    with open(tmp_path / "logs" / "rank-0.log", "w") as log:
        return subprocess.Popen([sys.executable, str(SMALL_LOOP), str(tmp_path / "run"),
                                 str(steps), "--step-time", str(STEP_S), *args],
                                stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path,
                                env={**clean_env(), "OMP_NUM_THREADS": "1"})


def listing(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


@pytest.fixture(scope="module")
def six_steps(tmp_path_factory) -> Path:
    """The loop's folder after 6 steps (checkpoints of steps 3 and 6): one run, which each
    test that starts from it copies (it was three identical runs)."""
    run = tmp_path_factory.mktemp("six-steps") / "run"
    done = small_loop(run, 6)
    assert done.returncode == 0, done.stderr[-3000:]
    return run


def copy_of(six_steps: Path, tmp_path: Path) -> Path:
    return shutil.copytree(six_steps, tmp_path / "run")


def test_another_optimizer_or_a_frozen_layer_is_another_loop_and_nothing_moves(six_steps,
                                                                                 tmp_path):
    run = copy_of(six_steps, tmp_path)
    before = listing(run / "checkpoints")
    assert before == ["latest", "step-000000003", "step-000000006"]
    for change, what in ((["--optimizer", "adam"], "its optimizer is 'SGD', this resume "
                          "passes Adam"),
                         (["--freeze"], "its optimizer steps [4] parameters (per group), "
                          "this one [2] (a layer frozen or thawed?)")):
        done = small_loop(run, 9, *change)
        assert done.returncode == 1 and "step 1" not in done.stdout, done.stderr[-3000:]
        last = done.stderr.strip().splitlines()[-1]
        assert f"{run / 'checkpoints' / 'step-000000006'} belongs to another training loop" \
            in last and what in last and "(nothing was moved or deleted)" in last, last
        assert listing(run / "checkpoints") == before
    again = small_loop(run, 9)
    assert again.returncode == 0 and "resumed at step 6" in again.stdout, again.stderr[-3000:]


def test_a_first_save_over_checkpoints_it_did_not_resume_is_refused(six_steps, tmp_path):
    run = copy_of(six_steps, tmp_path)
    before = {p.name: p.stat().st_mtime_ns for p in (run / "checkpoints").iterdir()}
    done = small_loop(run, 3, "--no-resume")
    assert done.returncode == 1 and "saved step" not in done.stdout, done.stderr[-3000:]
    last = done.stderr.strip().splitlines()[-1]
    assert "holds checkpoints (the newest at step 6) and this loop saves before calling " \
        "resume()" in last and "call ckpt.resume(" in last, last
    assert {p.name: p.stat().st_mtime_ns for p in (run / "checkpoints").iterdir()} == before


@pytest.mark.parametrize("end", ["none", "end-process"])
def test_a_loop_that_ends_without_close_commits_its_last_save(tmp_path, end):
    """The last save is the first: the writer is still starting when the loop ends. A
    wide layer (about 27 MB of state) keeps it at work a while longer."""
    run = tmp_path / "run"
    done = small_loop(run, 3, "--end", end, "--width", "50000")
    assert done.returncode == 0, done.stderr[-3000:]
    assert latest_step(run / "checkpoints") == 3, done.stderr[-3000:]
    assert "Traceback" not in done.stderr and "Error" not in done.stderr, done.stderr[-3000:]
    said = [line for line in done.stderr.splitlines() if "without close()" in line]
    assert len(said) == 1 and "waiting for the save of step 3" in said[0], done.stderr
    assert not list((run / "checkpoints").glob(".tmp-*")) and not (run / "train.lock").exists()


def test_a_writer_that_dies_stops_the_loop_at_the_next_step_not_the_next_save(tmp_path):
    logs = tmp_path / "logs"
    proc = start_small_loop(tmp_path, 40, "--save-every", "12")
    try:
        wait_for(logs, "saved step 12", [proc])
        writer = wait_for_writer([proc])
        # Three looks at the writer later (each step's `preempted`), the answer that step 12
        # is committed has been read; then the writer dies, the loop held meanwhile (a
        # killed process still needs a core to end and close its pipe).
        wait_for(logs, "step 16", [proc])
        os.kill(proc.pid, signal.SIGSTOP)
        os.kill(writer, signal.SIGKILL)
        wait_until_exited(writer)
        os.kill(proc.pid, signal.SIGCONT)
        proc.wait(timeout=120)
    finally:
        proc.kill()
        proc.wait()
    text = (logs / "rank-0.log").read_text()
    assert proc.returncode == 1 and "the checkpoint writer process died (killed by signal " \
        "9)" in text, text[-3000:]
    last = int(re.findall(r"^step (\d+)$", text, re.M)[-1])
    assert last < 20, f"noticed at step {last}, the next save is at 24"


def test_a_stopped_writer_is_named_and_a_preemption_leaves_without_its_save(tmp_path):
    logs, run = tmp_path / "logs", tmp_path / "run"
    proc = start_small_loop(tmp_path, 40)
    try:
        wait_for(logs, "saved step 3", [proc])
        writer = wait_for_writer([proc])
        os.kill(writer, signal.SIGSTOP)  # stopped, as a debugger or a frozen cgroup does
        wait_for(logs, f"still waiting for the checkpoint writer (PID {writer}, state T: "
                 "stopped) to commit step", [proc])
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    finally:
        proc.kill()  # a writer still there dies with it (stopped or not: SIGKILL)
        proc.wait()
    text = (logs / "rank-0.log").read_text()
    assert proc.returncode == 75, text[-3000:]
    assert re.search(rf"SIGTERM while the checkpoint writer \(PID {writer}, state T: stopped\)"
                     r" held the save of step (3|6): leaving without it", text), text[-3000:]
    assert "Traceback" not in text and writer_of(proc.pid) is None
    again = small_loop(run, 9)
    assert again.returncode == 0, again.stderr[-3000:]


@pytest.mark.root  # a pids cgroup of its own
def test_a_writer_that_cannot_start_under_a_pids_limit_saves_synchronously(tmp_path):
    """The loop is moved into a cgroup whose pids.max is the tasks it has: its writer's
    fork fails (EAGAIN), as it does on a node whose job reached its pids limit."""
    logs, run = tmp_path / "logs", tmp_path / "run"
    cgroup = Path("/sys/fs/cgroup/pids") / f"hpc-train-test-{os.getpid()}-{tmp_path.name}"
    cgroup.mkdir()
    try:
        proc = start_small_loop(tmp_path, 9)
        try:
            wait_for(logs, "resumed at step 0", [proc])
            (cgroup / "cgroup.procs").write_text(f"{proc.pid}\n")
            (cgroup / "pids.max").write_text((cgroup / "pids.current").read_text())
            proc.wait(timeout=120)
        finally:
            proc.kill()
            proc.wait()
    finally:
        cgroup.rmdir()
    text = (logs / "rank-0.log").read_text()
    assert proc.returncode == 0, text[-3000:]
    said = [line for line in text.splitlines() if "could not start" in line]
    assert len(said) == 1 and "the checkpoint writer process could not start (" in said[0] \
        and "saving synchronously instead" in said[0], text[-3000:]
    assert [step for step, _ in complete_steps(run / "checkpoints")] == [3, 6, 9]
    again = small_loop(run, 12)
    assert again.returncode == 0 and "resumed at step 9" in again.stdout, again.stderr[-3000:]


def test_a_save_keeps_a_step_left_off_the_timeline_it_would_replace(six_steps, tmp_path):
    """A crash between a save's rename and `latest`: the resume leaves that step's folder
    where it is ("it is kept"), and the save of the same step later keeps it too."""
    run = copy_of(six_steps, tmp_path)
    left = run / "checkpoints" / "step-000000006"
    manifest = (left / "MANIFEST.json").read_bytes()
    (run / "checkpoints" / "latest").write_text("step-000000003\n")
    done = small_loop(run, 6)
    assert done.returncode == 0 and "resumed at step 3" in done.stdout, done.stderr[-3000:]
    assert "it is kept" in done.stderr
    [kept] = (run / "checkpoints").glob("step-000000006.abandoned-*")
    assert (kept / "MANIFEST.json").read_bytes() == manifest and left.is_dir()
    assert latest_step(run / "checkpoints") == 6


def test_a_save_on_rank_0_only_is_named_within_seconds(tmp_path):
    """H2 (issue 59): `if rank == 0: ckpt.save(...)`, a torch.save habit, hung both ranks
    silently until the process group's timeout. Rank 0 now says that save is a collective
    within seconds (10 s), and at the group's timeout raises that line."""
    logs = tmp_path / "logs"
    loop = TESTS / "scripts" / "own_loop_rank0_save.py"
    procs = start_logged_ranks([sys.executable, str(loop), str(tmp_path / "run"), "15"], logs)
    said = ("Checkpoints.save: save is a collective: call it on every rank (not under `if "
            "rank == 0:`); rank 0 has waited 10 s in the save of step 2 for rank 1 to call "
            "it too")
    try:
        deadline = time.monotonic() + 120
        while "saving step 2" not in output(logs) and time.monotonic() < deadline:
            time.sleep(0.2)
        saved_at = time.monotonic()
        while said not in output(logs) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert said in output(logs), output(logs)[-4000:]
        assert time.monotonic() - saved_at < 20  # within seconds, not at the timeout
        procs[0].wait(timeout=60)  # at the group's timeout: the line, raised
        assert procs[0].returncode != 0
        assert ("UsageError: Checkpoints.save: save is a collective: call it on every rank"
                in output(logs)), output(logs)[-4000:]
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
