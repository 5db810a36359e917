"""`diagnose RUN_DIR --preflight REPORT`: the nodes `doctor`'s preflight found unfit, before
a job's first step (jobs/lib/requeue.sh runs doctor in the step's shape with `--json
REPORT`, then this): each recorded in bad-nodes.jsonl, and the step's nodes chosen as
after a failed step (the healthy ones, a spare in place of an unfit one; fewer where
MIN_NODES allows; else the queue), printed as `--after-step` prints its decision.

A node is unfit when one of its ranks failed a check of its own hardware: its GPU
invisible (`gpu`), its matmul failed or wrong (`matmul`), its GPU's health (`gpu-health`:
an uncorrected ECC error; a warning, a throttle, does not count). A check that failed
on every node of the report is the job's own setting (`--device cuda` with no GPU asked
for), not a node's, and names none. The report is data: read as a regular file of
bounded size, every field checked by type before it is used."""

from __future__ import annotations

import argparse

from workload.diagnose.attempts import bad_nodes, is_node_name, record_bad_nodes
from workload.diagnose.decision import Decision, Nodes, after_failure
from workload.diagnose.records import shown
from workload.errors import UsageError
from workload.files import read_json_file
from workload.runfolder import RunFolder

REPORT_BYTES = 16 << 20  # doctor's JSON: a rank map and findings of thousands of ranks
NODE_CHECKS = ("gpu", "matmul", "gpu-health")
FAILED = "fail"


def read_report(path: str) -> dict:
    try:
        report = read_json_file(path, REPORT_BYTES)
    except (OSError, ValueError) as exc:
        raise UsageError(f"--preflight {shown(path)}: not doctor's JSON report "
                         f"({shown(getattr(exc, 'strerror', None) or exc)}); pass the "
                         "file doctor --json wrote") from None
    if not (isinstance(report, dict) and isinstance(report.get("ranks"), list)
            and isinstance(report.get("findings"), list)):
        raise UsageError(f"--preflight {shown(path)}: no ranks and findings lists; pass "
                         "the file doctor --json wrote")
    return report


def unfit_nodes(report: dict) -> dict[str, str]:
    """node -> why, for the nodes whose ranks failed a check of their own hardware that
    did not fail on every node."""
    node_of = {place["rank"]: place["node"] for place in report["ranks"]
               if isinstance(place, dict) and isinstance(place.get("rank"), int)
               and is_node_name(place.get("node"))}
    failed: dict[str, dict[str, str]] = {}  # check -> node -> detail
    for finding in report["findings"]:
        if (isinstance(finding, dict) and finding.get("status") == FAILED
                and finding.get("check") in NODE_CHECKS
                and finding.get("rank") in node_of and isinstance(finding.get("detail"), str)):
            failed.setdefault(finding["check"], {}).setdefault(
                node_of[finding["rank"]], shown(finding["detail"], 300))
    every_node = set(node_of.values())
    named: dict[str, str] = {}
    for check, nodes in failed.items():
        if set(nodes) != every_node:
            for node, detail in nodes.items():
                named.setdefault(node, f"doctor's preflight: {check} failed: {detail}")
    return named


def preflight(run: RunFolder, args: argparse.Namespace, allocation: tuple[str, ...],
              step: tuple[str, ...]) -> Decision:
    """Record the unfit nodes; the first step's nodes, as after a failed step."""
    unfit = unfit_nodes(read_report(args.preflight))
    record_bad_nodes(run, unfit, args.job)
    bad = tuple(bad_nodes(run))
    nodes = Nodes(step=step, spares=tuple(n for n in allocation if n not in step), bad=bad,
                  minimum=args.min_nodes)
    found = (f"doctor's preflight found {', '.join(sorted(unfit))} unfit" if unfit
             else "doctor's preflight found every node fit")
    return after_failure(found, "before the first step", nodes, tuple(sorted(set(bad))), 0)
