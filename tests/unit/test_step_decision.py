"""The one decision after a job step (workload/diagnose/decision.py): a table of endings,
verdicts, progress and nodes against what the job does next; and `diagnose RUN_DIR
--after-step`, as the job scripts run it, recording each decision and the nodes it
leaves behind in the run folder, and `diagnose RUN_DIR` printing the same decision."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import run_diagnose as diagnose
from workload.diagnose.decision import (DONE, REQUEUE, RESTART, SHRINK, STOP, Ending, Nodes,
                                        Progress, decide)
from workload.diagnose.hardware import FABRIC, GPU, hardware_kind
from workload.doctor.findings import FAIL, OK, Finding, write_json_report
from workload.training.startup import StartupClock

TWO_AND_SPARE = Nodes(step=("n1", "n2"), spares=("n3",))
HANG = "rank 1 wrote no stall dump while the others did"
GPU_ERROR = "rank 1 failed with a GPU error: RuntimeError: CUDA error: unspecified launch failure"
# (ending, verdict, progress, nodes, max without progress) -> (action, next nodes, left behind)
CASES = {
    "finished": (Ending(0), "", Progress(10, 20), TWO_AND_SPARE, 3, (DONE, (), ())),
    "finished without progress is still finished":
        (Ending(0), "", Progress(20, 20, 5), TWO_AND_SPARE, 3, (DONE, (), ())),
    "usage error stops at once":
        (Ending(2), "", Progress(None, None), TWO_AND_SPARE, 3, (STOP, (), ())),
    "time limit requeues": (Ending(75, "preempted by SIGUSR2 at step 30", True), "",
                            Progress(10, 30), TWO_AND_SPARE, 3, (REQUEUE, (), ())),
    "preemption seen by the requeue file only": (Ending(143, "preempted by SIGTERM at step 3"),
                                                 "", Progress(None, 3), TWO_AND_SPARE, 3,
                                                 (REQUEUE, (), ())),
    "a requeue leaves the bad nodes behind": (Ending(75, "", True), "", Progress(1, 2),
                                              Nodes(("n1", "n2"), bad=("n2",)), 3,
                                              (REQUEUE, (), ("n2",))),
    "node lost: the spare in, the bad node out":
        (Ending(1), "", Progress(10, 20), Nodes(("n1", "n2"), ("n3",), ("n2",)), 3,
         (RESTART, ("n1", "n3"), ("n2",))),
    "a hang's node left behind": (Ending(1), HANG, Progress(10, 20),
                                  Nodes(("n1", "n2"), ("n3",), ("n1",)), 3,
                                  (RESTART, ("n2", "n3"), ("n1",))),
    "a GPU error's node left behind: the spare in":
        (Ending(1), GPU_ERROR, Progress(10, 20), Nodes(("n1", "n2"), ("n3",), ("n2",)), 3,
         (RESTART, ("n1", "n3"), ("n2",))),
    "a GPU error, no spare: shrink where allowed":
        (Ending(1), GPU_ERROR, Progress(10, 20), Nodes(("n1", "n2"), (), ("n2",), 1), 3,
         (SHRINK, ("n1",), ("n2",))),
    "a crash naming no node restarts on the same nodes":
        (Ending(1), "", Progress(10, 20), TWO_AND_SPARE, 3, (RESTART, ("n1", "n2"), ())),
    "no spare: shrink where allowed": (Ending(1), "", Progress(10, 20),
                                       Nodes(("n1", "n2"), (), ("n2",), minimum=1), 3,
                                       (SHRINK, ("n1",), ("n2",))),
    "no spare, no shrink: requeue": (Ending(1), "", Progress(10, 20),
                                     Nodes(("n1", "n2"), (), ("n2",)), 3,
                                     (REQUEUE, (), ("n2",))),
    "too few even to shrink: requeue": (Ending(137), "", Progress(10, 20),
                                        Nodes(("n1", "n2", "n3"), (), ("n2", "n3"), 2), 3,
                                        (REQUEUE, (), ("n2", "n3"))),
    "a bad spare is no spare": (Ending(1), "", Progress(10, 20),
                                Nodes(("n1", "n2"), ("n3",), ("n2", "n3")), 3,
                                (REQUEUE, (), ("n2", "n3"))),
    "third failure at the same step stops": (Ending(1), "", Progress(20, 20, 2),
                                             TWO_AND_SPARE, 3, (STOP, (), ())),
    "second failure at the same step restarts": (Ending(1), "", Progress(20, 20, 1),
                                                 TWO_AND_SPARE, 3, (RESTART, ("n1", "n2"), ())),
    "the limit is settable": (Ending(1), "", Progress(20, 20, 0), TWO_AND_SPARE, 1,
                              (STOP, (), ())),
    "no checkpoint ever counts as none new": (Ending(1), "", Progress(None, None, 2),
                                              TWO_AND_SPARE, 3, (STOP, (), ())),
    "a progressing run is never stopped": (Ending(75, "", True), "", Progress(20, 30, 9),
                                           TWO_AND_SPARE, 3, (REQUEUE, (), ())),
    "time limits without progress stop too": (Ending(75, "", True), "", Progress(30, 30, 2),
                                              TWO_AND_SPARE, 3, (STOP, (), ())),
    "a rollback moves": (Ending(1), "", Progress(30, 10, 2), TWO_AND_SPARE, 3,
                         (RESTART, ("n1", "n2"), ())),
}


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_the_decision_of_each_case(case):
    ending, verdict, progress, nodes, most, wanted = CASES[case]
    decision = decide(ending, verdict, progress, nodes, most)
    assert (decision.action, decision.nodes, decision.exclude) == wanted, decision.line()
    assert decision.reasons and all(decision.reasons)


def test_the_stop_line_names_the_last_step_the_attempts_and_the_failure():
    decision = decide(Ending(1), HANG, Progress(40, 40, 2), TWO_AND_SPARE)
    assert decision.line() == (
        "stop: no new checkpoint in 3 attempt(s) in a row (last checkpoint: step 40); "
        f"last failure: status 1; diagnose: {HANG}")


def checkpointed(run: Path, step: int) -> None:
    (run / "checkpoints").mkdir(parents=True, exist_ok=True)
    (run / "checkpoints" / "latest").write_text(f"step-{step:09d}\n")


def answered(run: Path, *flags: str) -> dict[str, str]:
    """diagnose's decision as the job script reads it (a later flag overrides these)."""
    done = diagnose(run, "--job", "42", "--allocation", "nid[001-003]", "--step-nodes",
                    "nid[001-002]", *flags)
    assert done.returncode == 0, done.stderr
    assert done.stderr.startswith("decision: ")
    return dict(line.split("=", 1) for line in done.stdout.splitlines())


def after(run: Path, status: int, *flags: str) -> dict[str, str]:
    return answered(run, "--after-step", str(status), *flags)


def hung_rank(run: Path, time: float) -> None:
    """Rank 0 on nid001 stalled and dumped; rank 1 on nid002 went silent: a hang on nid002."""
    folder = run / "diagnostics"
    folder.mkdir(parents=True, exist_ok=True)
    for rank, stalled in ((0, True), (1, False)):
        (folder / f"heartbeat-{rank}.json").write_text(json.dumps(dict(
            rank=rank, world_size=2, host=f"nid00{rank + 1}", pid=10, step=8,
            phase="collective", time=time, stalled=stalled, attempt=1.0)))


def test_a_hang_records_its_node_and_the_step_restarts_on_the_spare(tmp_path):
    run = tmp_path / "run"
    checkpointed(run, 4)
    hung_rank(run, 4e9)  # newer than any decision: this attempt's
    assert after(run, 1) == {"action": "restart", "nodes": "nid001,nid003",
                             "exclude": "nid002"}
    listed = diagnose(run, "--bad-nodes").stdout
    assert listed.startswith("bad node: nid002: diagnose: rank 1 wrote no stall dump")
    assert "(job 42, " in listed
    shown = diagnose(run).stdout
    assert ("attempts: 1; the last decision: job 42, failure (status 1): restart on "
            "nid001,nid003, leaving nid002 behind: status 1; diagnose: rank 1") in shown
    assert diagnose(run, "--clear-bad-nodes", "nid002").stdout.startswith("cleared: nid002")
    assert diagnose(run, "--bad-nodes").stdout == "bad nodes: none\n"


# A stall dump's header past the 120 characters diagnose prints: its time still counts.
@pytest.mark.parametrize("host", ["nid001", "nid001-gpu-a100-rack17.cluster.example.org"])
def test_a_hang_the_steps_end_cleared_in_the_heartbeats_still_names_its_node(tmp_path, host):
    """The collective timeout ended the step, and SLURM's SIGCONT let the frozen rank take
    a last step: both heartbeats say finished, not stalled; rank 0's stall dump of this
    attempt is still there, rank 1 has none."""
    run = tmp_path / "run"
    checkpointed(run, 4)
    hung_rank(run, 4e9)
    for rank in (0, 1):
        path = run / "diagnostics" / f"heartbeat-{rank}.json"
        path.write_text(path.read_text().replace('"stalled": true', '"stalled": false')
                        .replace('"attempt": 1.0', '"attempt": 1796430500.0'))
    (run / "diagnostics" / "rank-0.txt").write_text(
        f"stalled: no step done for 3 s; rank 0 on {host}, pid 1, step 6, phase "
        "forward/backward, at 2026-12-05T00:29:39+0000\n")
    assert after(run, 1) == {"action": "restart", "nodes": "nid001,nid003",
                             "exclude": "nid002"}
    assert "nid002: diagnose: rank 1 wrote no stall dump while the others did" in \
        diagnose(run, "--bad-nodes").stdout


def test_an_earlier_attempts_hang_names_no_node_again(tmp_path):
    run = tmp_path / "run"
    checkpointed(run, 4)
    hung_rank(run, 1.0)  # older than the decision after the first attempt
    after(run, 1)
    diagnose(run, "--clear-bad-nodes")
    assert after(run, 1)["exclude"] == ""


# A rank's error (its last heartbeat's) -> whether a broken GPU or fabric gives it.
ERRORS = {
    "RuntimeError: CUDA error: unspecified launch failure": GPU,
    "RuntimeError: CUDA error: an uncorrectable ECC error was encountered": GPU,
    "RuntimeError: CUDA error: unknown error": GPU,
    "RuntimeError: CUDA error: CUDA-capable device(s) is/are busy or unavailable": GPU,
    "RuntimeError: NVML error: GPU is lost": GPU,
    "RuntimeError: Xid 79: GPU has fallen off the bus": GPU,
    "DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled cuda error": GPU,
    "DistBackendError: NCCL error in: /opt/pytorch/torch/csrc/distributed/c10d/NCCLUtils."
    "hpp:275, unhandled system error (run with NCCL_DEBUG=INFO for details)": FABRIC,
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB": "",
    "RuntimeError: CUDA error: out of memory": "",
    "RuntimeError: CUDA error: device-side assert triggered": "",
    "RuntimeError: CUDA error: an illegal memory access was encountered": "",
    "RuntimeError: [gloo] Connection closed by peer [10.0.0.2]:1234": "",
    "ValueError: bad label": "",
}


@pytest.mark.parametrize("error", ERRORS)
def test_which_errors_are_the_hardwares(error):
    assert hardware_kind(error) == ERRORS[error]


def failed_ranks(run: Path, *errors: str) -> None:
    """This attempt's ranks (rank r on nid00<r+1>), each ended with its error ("": none)."""
    folder = run / "diagnostics"
    folder.mkdir(parents=True, exist_ok=True)
    for rank, error in enumerate(errors):
        (folder / f"heartbeat-{rank}.json").write_text(json.dumps(dict(
            rank=rank, world_size=len(errors), host=f"nid00{rank + 1}", pid=10, step=6,
            phase="exited", time=4e9, stalled=False, attempt=1.0,
            **({"error": error} if error else {}))))


def test_a_ranks_gpu_error_records_its_node_and_the_step_restarts_on_the_spare(tmp_path):
    run = tmp_path / "run"
    checkpointed(run, 4)
    error = "RuntimeError: CUDA error: unspecified launch failure"
    failed_ranks(run, "RuntimeError: [gloo] Connection closed by peer", error)
    assert after(run, 1) == {"action": "restart", "nodes": "nid001,nid003",
                             "exclude": "nid002"}
    why = f"rank 1 failed with a GPU error: {error}"
    assert diagnose(run, "--bad-nodes").stdout.startswith(f"bad node: nid002: {why} (job 42,")
    record = json.loads((run / "attempts.jsonl").read_text())
    assert record["verdict"] == why
    assert record["reasons"][0] == f"status 1; diagnose: {why}"


def test_a_gpu_failing_at_start_up_names_its_node_and_an_earlier_error_no_node(
        tmp_path, monkeypatch):
    """Attempt 1: rank 0's GPU error on nid001 (its heartbeat); the node is cleared by a
    user. Attempt 2 fails before its first step, rank 1's GPU on nid002 as it is first
    used (its start-up record): nid002 is named, nid001 not again."""
    run = tmp_path / "run"
    checkpointed(run, 4)
    failed_ranks(run, "RuntimeError: CUDA error: unspecified launch failure", "")
    for rank in (0, 1):  # attempt 1's heartbeats, older than its decision
        path = run / "diagnostics" / f"heartbeat-{rank}.json"
        path.write_text(path.read_text().replace('"time": 4000000000.0', '"time": 1.0'))
    assert after(run, 1)["exclude"] == "nid001"
    diagnose(run, "--clear-bad-nodes")
    monkeypatch.setenv("SLURMD_NODENAME", "nid002")
    clock = StartupClock(run / "diagnostics" / "startup-rank-1.json")
    clock.mark("imports")
    clock.failed(RuntimeError("CUDA error: uncorrectable ECC error encountered"))
    assert after(run, 1) == {"action": "restart", "nodes": "nid001,nid003",
                             "exclude": "nid002"}
    assert diagnose(run, "--bad-nodes").stdout.startswith(
        "bad node: nid002: rank 1 failed with a GPU error: RuntimeError: CUDA error: "
        "uncorrectable ECC error encountered (job 42,")


def test_an_nccl_system_error_names_a_node_only_when_not_every_rank_has_it(tmp_path):
    nccl = "DistBackendError: NCCL error in: x.cpp:1, unhandled system error"
    everywhere, one = tmp_path / "everywhere", tmp_path / "one"
    failed_ranks(everywhere, nccl, nccl)
    assert after(everywhere, 1)["exclude"] == ""
    failed_ranks(one, "", nccl)
    assert after(one, 1)["exclude"] == "nid002"


def test_three_attempts_without_a_new_checkpoint_stop_the_run(tmp_path):
    run = tmp_path / "run"
    checkpointed(run, 4)
    assert [after(run, 1)["action"] for _ in range(4)] == ["restart"] * 3 + ["stop"]
    checkpointed(run, 6)
    assert after(run, 75, "--time-limit")["action"] == "requeue"
    assert after(run, 1, "--max-without-progress", "1")["action"] == "stop"
    records = [json.loads(line) for line in (run / "attempts.jsonl").read_text().splitlines()]
    assert [(r["started_from"], r["checkpointed"], r["without_progress"]) for r in records] == [
        (None, 4, 0), (4, 4, 1), (4, 4, 2), (4, 4, 3), (4, 6, 0), (6, 6, 1)]


def test_a_node_down_in_slurm_is_left_behind(tmp_path):
    run = tmp_path / "run"
    assert after(run, 143, "--down", "nid001") == {"action": "restart",
                                                   "nodes": "nid002,nid003",
                                                   "exclude": "nid001"}


@pytest.mark.parametrize("flags, words", [
    (("--max-without-progress", "0"), "--max-without-progress 0: expected"),
    (("--down", "nid[001-"), "expected a SLURM node list"),
    (("--down=../x",), "expected plain node names")])
def test_bad_decision_input_is_one_line_and_status_2(tmp_path, flags, words):
    done = diagnose(tmp_path, "--after-step", "1", *flags)
    assert done.returncode == 2 and words in done.stderr
    assert len(done.stderr.splitlines()) == 1
    assert not (tmp_path / "attempts.jsonl").exists()


def test_a_record_that_is_a_link_is_not_read_nor_written_through(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    target = tmp_path / "elsewhere.jsonl"
    target.write_text("")
    (run / "attempts.jsonl").symlink_to(target)
    done = diagnose(run, "--after-step", "1")
    assert done.returncode != 0 and target.read_text() == ""


def doctor_report(path: Path, failed: dict[int, tuple[str, str]]) -> Path:
    """doctor --json's report of 2 ranks (rank r on nid00<r+1>), written by doctor's own
    writer: `failed` rank -> (check, detail) of a failed check, the rest ok."""
    ranks = [dict(rank=rank, node=f"nid00{rank + 1}", local_rank=0, device="cuda:0")
             for rank in (0, 1)]
    findings = [(rank, Finding(failed[rank][0], FAIL, failed[rank][1], "drain the node")
                 if rank in failed else Finding("gpu-health", OK, "1 GPU(s) not throttled"))
                for rank in (0, 1)]
    findings.append((0, Finding("output-dir", FAIL, "runs is not writable")))  # the job's
    write_json_report(path, dict(world_size=2, ranks=ranks, findings=findings))
    return path


def preflight(run: Path, report: Path, *flags: str) -> dict[str, str]:
    return answered(run, "--preflight", str(report), *flags)


def test_a_node_doctors_preflight_finds_unfit_is_left_out_of_the_first_step(tmp_path):
    run = tmp_path / "run"
    detail = "rank 1 on nid002 (NVIDIA H100): 2 uncorrected ECC errors (volatile)"
    report = doctor_report(tmp_path / "preflight.json", {1: ("gpu-health", detail)})
    assert preflight(run, report) == {"action": "restart", "nodes": "nid001,nid003",
                                      "exclude": "nid002"}
    assert diagnose(run, "--bad-nodes").stdout.startswith(
        f"bad node: nid002: doctor's preflight: gpu-health failed: {detail} (job 42,")
    assert not (run / "attempts.jsonl").exists()  # no step was attempted
    # No spare left, and one node allowed: the step shrinks; else the job is requeued.
    assert preflight(run, report, "--allocation", "nid[001-002]", "--min-nodes", "1") == {
        "action": "shrink", "nodes": "nid001", "exclude": "nid002"}
    assert preflight(run, report, "--allocation", "nid[001-002]")["action"] == "requeue"


def test_a_check_failed_on_every_node_or_not_the_hardwares_names_none(tmp_path):
    """--device cuda where no GPU was asked for fails `gpu` everywhere: the job's setting,
    as is an output folder that cannot be written."""
    run = tmp_path / "run"
    missing = ("gpu", "--device cuda, but no GPU is visible")
    report = doctor_report(tmp_path / "preflight.json", {0: missing, 1: missing})
    assert preflight(run, report) == {"action": "restart", "nodes": "nid001,nid002",
                                      "exclude": ""}
    assert diagnose(run, "--bad-nodes").stdout == "bad nodes: none\n"


@pytest.mark.parametrize("text", ["", "[1, 2]", '{"ranks": [], "findings": {}}'])
def test_a_preflight_report_that_is_not_doctors_is_one_line_and_status_2(tmp_path, text):
    (tmp_path / "report.json").write_text(text)
    done = diagnose(tmp_path / "run", "--preflight", str(tmp_path / "report.json"))
    assert done.returncode == 2 and "--preflight" in done.stderr, done.stderr
    assert len(done.stderr.splitlines()) == 1

