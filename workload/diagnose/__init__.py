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
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from workload.commands import command_parser, main_of
from workload.diagnose.reading import read_folder
from workload.diagnose.records import shown
from workload.diagnose.verdict import describe, suspects, this_attempt, verdict

PROG = "diagnose"
NO_VERDICT = 1
PATH_CHARS = 1000  # a folder's path as printed


def diagnosis(run_dir: Path) -> dict:
    folder = read_folder(run_dir)
    ranks, world, left_out = this_attempt(folder.ranks)
    found, why = suspects(ranks, world)
    return dict(folder=shown(folder.path, PATH_CHARS), suspect_ranks=found,
                verdict=verdict(ranks, found, why),
                ranks={str(rank): r for rank, r in sorted(ranks.items())},
                lines=[describe(r) for _, r in sorted(ranks.items())],
                left_out=left_out, skipped=folder.skipped, torch_dumps=folder.pickled)


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
    return p


def diagnose(args: argparse.Namespace) -> None:
    result = diagnosis(Path(args.run_dir))
    if args.json:
        print(json.dumps({k: v for k, v in result.items() if k != "lines"}, indent=1))
    else:
        print_diagnosis(result)
    if not result["suspect_ranks"]:
        sys.exit(NO_VERDICT)


main = main_of(PROG, build_parser(), diagnose)


if __name__ == "__main__":
    sys.exit(main())
