"""`diagnose`: which rank held a hung or stalled job up, what it was doing, and what the
others waited in, from what the ranks left in <RUN_DIR>/diagnostics (docs/hangs.md).

After a job stopped on a timeout, or while it hangs (the login node is fine; it reads
files only):
    diagnose runs/wrn                 # the verdict, one line per rank
    diagnose runs/wrn --json          # the same as JSON: suspect_ranks, ranks, verdict
    apptainer exec image.sif diagnose $SCRATCH/runs/wrn

It reads each rank's heartbeat (heartbeat-<N>.json: step, phase, host, attempt), its
stall dump (rank-<N>.txt: every thread's stack, written by the stall watchdog or on
SIGUSR1) and its flight recorder copy (fr-rank-<N>.json: the collectives it entered),
of the newest attempt only. It reads regular files inside the folder only (links are not
followed) and names each file it leaves out. torch's own dumps on a collective timeout
(fr-rank-<N>, pickles) are never unpickled here: it names the command of torch's
analyser for them. Exit status: 0 a verdict, 1 nothing points to a rank, 2 no
diagnostics folder (RUN_DIR holds neither one nor the files themselves).

A run of the job scripts (jobs/lib/requeue.sh) also keeps the decision after each of its
steps (restart here, shrink, requeue or stop, with the reasons) and the nodes it left
behind (docs/failures.md); diagnose prints the last decision and those nodes:
    diagnose runs/wrn --bad-nodes                 # only the nodes left behind
    diagnose runs/wrn --clear-bad-nodes nid002    # use nid002 again (no name: all of them)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from workload.commands import command_parser, main_of
from workload.diagnose import after_step
from workload.diagnose.attempts import (attempt_line, attempts, bad_node_lines,
                                        clear_bad_nodes)
from workload.diagnose.verdict import diagnosis
from workload.errors import UsageError
from workload.runfolder import RunFolder

PROG = "diagnose"
NO_VERDICT = 1


def print_diagnosis(result: dict) -> None:
    print(f"diagnose: {result['folder']}, {len(result['ranks'])} rank(s) left files")
    print(f"verdict: {result['verdict']}")
    for line in result["lines"]:
        print(f"  {line}")
    for line in result["left_out"]:
        print(f"left out: {line}")
    for line in result["skipped"]:
        print(f"skipped: {line}")
    if result["torch_dumps"]:
        print(f"torch's flight recorder dumps ({len(result['torch_dumps'])}): python -m "
              f"torch.distributed.flight_recorder.fr_trace {result['folder']} (it unpickles "
              "them: run it only on dumps of your own job)")


def build_parser() -> argparse.ArgumentParser:
    p = command_parser(PROG, __doc__)
    p.add_argument("run_dir", metavar="RUN_DIR", help="a train --output-dir, or a "
                   "diagnostics folder")
    p.add_argument("--json", action="store_true", help="print the diagnosis as JSON")
    p.add_argument("--bad-nodes", action="store_true",
                   help="list the nodes the run left behind: which, why, when")
    p.add_argument("--clear-bad-nodes", nargs="*", metavar="NODE", default=None,
                   help="use these nodes again (no name: every one)")
    after_step.add_arguments(p)
    return p


def print_history(run: RunFolder) -> None:
    """The last decision after a step, and the nodes left behind."""
    history, left_out = attempts(run)
    if history:
        print(f"attempts: {len(history)}; the last decision: {attempt_line(history[-1])}")
    for line in left_out:
        print(f"left out: {line}")
    for line in bad_node_lines(run):
        print(f"bad node: {line}")


def manage_bad_nodes(run: RunFolder, args: argparse.Namespace) -> None:
    if args.clear_bad_nodes is not None:
        cleared = clear_bad_nodes(run, args.clear_bad_nodes)
        print(f"cleared: {', '.join(cleared) or 'none of them was recorded'}")
    lines = bad_node_lines(run)
    print("\n".join(f"bad node: {line}" for line in lines) if lines else "bad nodes: none")


def diagnose(args: argparse.Namespace) -> None:
    run = RunFolder.of(args.run_dir)
    if args.after_step is not None:
        after_step.print_for_the_job(after_step.after_step(run, args))
        return
    if args.preflight is not None:
        after_step.print_for_the_job(after_step.before_first_step(run, args))
        return
    if args.bad_nodes or args.clear_bad_nodes is not None:
        manage_bad_nodes(run, args)
        return
    try:
        result = diagnosis(Path(args.run_dir))
    except UsageError:
        if not attempts(run)[0]:
            raise
        print_history(run)  # the job's record without diagnostics: a start-up failure
        sys.exit(NO_VERDICT)
    if args.json:
        history = attempts(run)[0]
        print(json.dumps({**{k: v for k, v in result.items() if k != "lines"},
                          "last_decision": history[-1] if history else None,
                          "bad_nodes": bad_node_lines(run)}, indent=1))
    else:
        print_diagnosis(result)
        print_history(run)
    if not result["suspect_ranks"]:
        sys.exit(NO_VERDICT)


main = main_of(PROG, build_parser(), diagnose)


if __name__ == "__main__":
    sys.exit(main())
