"""`diagnose RUN_DIR --after-step STATUS ...`: the decision after a job step, made from the
run's files and what the batch shell saw, recorded in attempts.jsonl and printed, for the
job script (jobs/lib/requeue.sh) to run: `key=value` lines on stdout, which it reads
without evaluating them, and the decision's line on stderr, into the job's log.

    action=restart            done | restart | shrink | requeue | stop
    nodes=nid001,nid003       the next step's nodes (restart, shrink)
    exclude=nid002            the nodes left behind (every bad node of the record)
"""

from __future__ import annotations

import argparse
import sys

from workload.checkpoint import checkpoints_dir, latest_step
from workload.diagnose.attempts import (attempts, bad_nodes, is_node_name, record_attempt,
                                        record_bad_nodes)
from workload.diagnose.decision import (DEFAULT_MAX_WITHOUT_PROGRESS, Decision, Ending, Nodes,
                                        Progress, decide)
from workload.diagnose.hardware import hardware_nodes, rank_errors
from workload.diagnose.preflight import preflight
from workload.diagnose.verdict import diagnosis, is_stalled, rank_list
from workload.errors import LaunchError, UsageError
from workload.files import unwritable_reason
from workload.launch.variables import expand_nodes
from workload.runfolder import RunFolder


def add_arguments(p: argparse.ArgumentParser) -> None:
    after = p.add_argument_group("the decision after a job step (jobs/lib/requeue.sh)")
    after.add_argument("--after-step", type=int, metavar="STATUS", default=None,
                       help="decide what the job does after a step that ended with STATUS, "
                            "record it in RUN_DIR/attempts.jsonl and print it")
    after.add_argument("--requeue-asked", default="", metavar="TEXT",
                       help="train's requeue request (it checkpointed on a signal)")
    after.add_argument("--time-limit", action="store_true",
                       help="the batch shell got the time-limit signal")
    after.add_argument("--job", default="", help="the job id, for the record")
    after.add_argument("--allocation", default="", metavar="NODELIST",
                       help="the job's nodes (SLURM_JOB_NODELIST)")
    after.add_argument("--step-nodes", default="", metavar="NODELIST",
                       help="the nodes the step ran on (default: the allocation)")
    after.add_argument("--down", default="", metavar="NODELIST",
                       help="nodes SLURM says are down, drained or failing")
    after.add_argument("--min-nodes", type=int, default=0, metavar="N",
                       help="the fewest nodes the run may shrink to (default: never shrink)")
    after.add_argument("--preflight", metavar="REPORT", default=None,
                       help="before the first step: record the nodes doctor's JSON REPORT "
                            "found unfit and print the step's nodes (the other flags as "
                            "with --after-step)")
    after.add_argument("--max-without-progress", type=int, metavar="N",
                       default=DEFAULT_MAX_WITHOUT_PROGRESS,
                       help="stop after N attempts in a row with no new checkpoint "
                            f"(default {DEFAULT_MAX_WITHOUT_PROGRESS})")


def node_list(flag: str, value: str) -> tuple[str, ...]:
    if not value:
        return ()
    try:
        nodes = tuple(expand_nodes(flag, value))
    except LaunchError as exc:
        raise UsageError(str(exc)) from None
    if not all(map(is_node_name, nodes)):
        raise UsageError(f"{flag} {value!r}: expected plain node names such as nid[001-003]")
    return nodes


def check_numbers(args: argparse.Namespace) -> None:
    if args.max_without_progress < 1:
        raise UsageError(f"--max-without-progress {args.max_without_progress}: expected a "
                         "whole number of attempts of 1 or more, such as 3")
    if args.min_nodes < 0:
        raise UsageError(f"--min-nodes {args.min_nodes}: expected 0 (never shrink) or more")


def run_diagnosis(run: RunFolder) -> dict | None:
    """diagnose's reading of the run's files (None: no diagnostics folder, the step never
    reached train's start)."""
    try:
        return diagnosis(run.root)
    except UsageError:
        return None


def this_attempts_heartbeats(found: dict | None, since: float) -> dict | None:
    """`found` when its newest heartbeat is this attempt's (newer than the last decision):
    an earlier attempt's hang would name its nodes again."""
    newest = max((r.get("time", 0) for r in found["ranks"].values()), default=0) if found else 0
    return found if newest > since else None


def stalled_this_attempt(record: dict, attempt: float) -> bool:
    """The rank's stall watchdog fired in this attempt: its heartbeat says so, or its last
    stall dump is dated after the attempt began. The heartbeat's flag alone is not enough:
    it is cleared once a step is done again, and the signals that end a step after a
    collective timeout (SLURM's SIGCONT with its SIGTERM) let a frozen rank finish one."""
    if is_stalled(record):
        return True
    # The dump's time is in whole seconds.
    return record.get("dumped_at", float("-inf")) >= attempt - 1


def named_nodes(found: dict | None) -> dict[str, str]:
    """The nodes diagnose names, node -> why, when the stall watchdog fired in this
    attempt: the hosts of the ranks that wrote no stall dump while others did, else of
    the verdict's suspects (a crash alone names no node: the ranks a failed rank's srun
    killed are no suspects of a hang)."""
    if not found:
        return {}
    ranks = found["ranks"]
    attempt = max((r.get("attempt", 0) for r in ranks.values()), default=0)
    dumped = {rank for rank, r in ranks.items() if stalled_this_attempt(r, attempt)}
    if not dumped:
        return {}
    silent = sorted(set(ranks) - dumped, key=int)
    why = (f"diagnose: {rank_list([int(rank) for rank in silent])} wrote no stall dump "
           "while the others did" if silent else f"diagnose: {found['verdict']}")
    named = silent or [str(rank) for rank in found["suspect_ranks"]]
    hosts = {ranks.get(rank, {}).get("host") for rank in named}
    return {host: why for host in hosts if is_node_name(host)}


def progress_of(run: RunFolder, history: list[dict]) -> Progress:
    last = history[-1] if history else None
    return Progress(started_from=last["checkpointed"] if last else None,
                    checkpointed=latest_step(checkpoints_dir(run.root)),
                    stalled_before=last["without_progress"] if last else 0)


def after_step(run: RunFolder, args: argparse.Namespace) -> Decision:
    """Gather, decide, record (the bad nodes, then the attempt)."""
    return recorded(run, args, decided)


def before_first_step(run: RunFolder, args: argparse.Namespace) -> Decision:
    """doctor's preflight read, its unfit nodes recorded, the first step's nodes chosen."""
    def chosen(run: RunFolder, args: argparse.Namespace) -> Decision:
        allocation = node_list("--allocation", args.allocation)
        return preflight(run, args, allocation,
                         node_list("--step-nodes", args.step_nodes) or allocation)
    return recorded(run, args, chosen)


def recorded(run: RunFolder, args: argparse.Namespace, decision) -> Decision:
    """`decision(run, args)`, which records in the run folder, once the input is checked
    and the folder can be written."""
    check_numbers(args)
    # Made when missing, as train makes it: a step that failed before train did still
    # counts as an attempt.
    if problem := unwritable_reason(run.root, create=True):
        raise UsageError(f"RUN_DIR {run.root}: {problem}; the decision is recorded there")
    try:
        return decision(run, args)
    except OSError as exc:  # a record that is a link, a FIFO, a full disk
        raise UsageError(f"cannot record the decision in {run.root} ({exc.strerror or exc}); "
                         f"move {exc.filename or 'the file'} away") from None


def decided(run: RunFolder, args: argparse.Namespace) -> Decision:
    allocation = node_list("--allocation", args.allocation)
    step = node_list("--step-nodes", args.step_nodes) or allocation
    history, _ = attempts(run)
    since = history[-1]["time"] if history else 0.0
    read = run_diagnosis(run)
    found = this_attempts_heartbeats(read, since)
    hung = named_nodes(found)
    broken = hardware_nodes(rank_errors(read["ranks"], since)) if read else {}
    down = {node: "SLURM says it is down" for node in node_list("--down", args.down)}
    record_bad_nodes(run, {**broken, **hung, **down}, args.job)
    bad = tuple(bad_nodes(run))
    ending = Ending(args.after_step, args.requeue_asked, args.time_limit)
    progress = progress_of(run, history)
    nodes = Nodes(step=step, spares=tuple(n for n in allocation if n not in step), bad=bad,
                  minimum=args.min_nodes)
    verdict = verdict_of(found, hung, broken)
    decision = decide(ending, verdict, progress, nodes, args.max_without_progress)
    record_attempt(run, dict(job=args.job, status=ending.status, ending=ending.kind(),
                             started_from=progress.started_from,
                             checkpointed=progress.checkpointed,
                             without_progress=decision.without_progress, verdict=verdict,
                             action=decision.action, nodes=list(decision.nodes),
                             exclude=list(decision.exclude), reasons=list(decision.reasons)))
    return decision


def verdict_of(found: dict | None, hung: dict[str, str], broken: dict[str, str]) -> str:
    """The failure as diagnose reads it: a hardware error names its rank (the ranks a
    failed rank's srun killed are no hang's suspects), else the ranks the stall dumps of
    this attempt name (the same whether the others' exit came before the step was ended
    or not), else the verdict's suspects."""
    if broken:
        return next(iter(broken.values()))
    if hung:
        return next(iter(hung.values())).removeprefix("diagnose: ")
    return found["verdict"] if found and found["suspect_ranks"] else ""


def print_for_the_job(decision: Decision) -> None:
    """The key=value lines on stdout, the decision's line on stderr (the job's log)."""
    print(f"action={decision.action}")
    print(f"nodes={','.join(decision.nodes)}")
    print(f"exclude={','.join(decision.exclude)}")
    print(f"decision: {decision.line()}", file=sys.stderr)
