"""The run folder's record of its attempts and of its bad nodes, both JSON lines appended
to (never rewritten), so the history of a run can be read afterwards:

    attempts.jsonl    a line per job step ended: when, the job, its status and how it
                      ended, the step it started from and the one it checkpointed, the
                      attempts in a row without a new checkpoint, diagnose's verdict,
                      and the decision (action, nodes, nodes left behind, reasons)
    bad-nodes.jsonl   a line per node named bad (which, why, when, the job), and a line
                      `cleared` when a user clears it (`diagnose RUN_DIR --clear-bad-nodes`)

The files sit in a run folder others in the project may write: they are appended to
without following a link (files.append_jsonl), read as regular files only and at most
RECORD_BYTES, and every field is checked by type, and every number against the package's
table of bounds (workload.config.bounds), before it is used or printed; a node
name is used only when it is a plain host name, as it goes into scontrol and srun.
"""

from __future__ import annotations

import re
import time

from workload.config import record_problem
from workload.diagnose.records import shown
from workload.files import append_jsonl, read_jsonl_records
from workload.runfolder import RunFolder

RECORD_BYTES = 8 << 20  # thousands of attempts; more is not a run's own record
NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}", re.ASCII)
_OPTIONAL_INT = (int, type(None))
# Each field of an attempt's line and the types it may have (bool is no number here).
ATTEMPT_FIELDS = {"time": (int, float), "job": (str,), "status": (int,), "ending": (str,),
                  "started_from": _OPTIONAL_INT, "checkpointed": _OPTIONAL_INT,
                  "without_progress": (int,), "verdict": (str,), "action": (str,),
                  "nodes": (list,), "exclude": (list,), "reasons": (list,)}
BAD_NODE_FIELDS = {"time": (int, float), "node": (str,), "why": (str,), "job": (str,),
                   "cleared": (bool,)}


def is_node_name(value: object) -> bool:
    return isinstance(value, str) and bool(NODE_NAME.fullmatch(value))


def checked(record: dict, fields: dict[str, tuple[type, ...]]) -> dict | None:
    """The record with each field of its type, or None (a line of another kind)."""
    for key, types in fields.items():
        value = record.get(key)
        if isinstance(value, bool) and bool not in types or not isinstance(value, types):
            return None
    return {key: record[key] for key in fields}


def read_checked(path, fields: dict[str, tuple[type, ...]]) -> tuple[list[dict], list[str]]:
    """The checked records of a JSON-lines file (none when it is missing), and a line for
    each one left out."""
    try:
        records, left_out = read_jsonl_records(path, RECORD_BYTES, follow_links=False)
    except FileNotFoundError:
        return [], []
    except OSError as exc:
        return [], [f"{shown(path)} cannot be read ({exc.strerror or exc})"]
    kept: list[dict] = []
    bad: list[str] = []
    for record in records:
        # A number past its bound is named (a time of 1e20); any other field of the wrong
        # type makes a line of another kind.
        problem = record_problem(record, fields)
        found = None if problem else checked(record, fields)
        if found is None:
            bad.append(problem or "not of its kind")
        else:
            kept.append(found)
    # One line for all of them, naming the first one's fault (a time of 1e20, say).
    return kept, left_out + ([f"{len(bad)} line(s) of {path.name} left out, the first: "
                              f"{bad[0]}"] if bad else [])


def attempts(run: RunFolder) -> tuple[list[dict], list[str]]:
    """The run's attempts, oldest first, and the lines left out."""
    return read_checked(run.attempts, ATTEMPT_FIELDS)


def record_attempt(run: RunFolder, record: dict) -> None:
    append_jsonl(run.attempts, {"time": time.time(), **record})


def bad_nodes(run: RunFolder) -> dict[str, dict]:
    """The nodes named bad and not cleared since: node -> its newest record."""
    found: dict[str, dict] = {}
    for record in read_checked(run.bad_nodes, BAD_NODE_FIELDS)[0]:
        if not is_node_name(record["node"]):
            continue
        if record["cleared"]:
            found.pop(record["node"], None)
        else:
            found[record["node"]] = record
    return found


def record_bad_nodes(run: RunFolder, named: dict[str, str], job: str) -> list[str]:
    """Record the nodes of `named` (node -> why) that are not recorded yet; the ones
    recorded now."""
    known = bad_nodes(run)
    new = [node for node in named if is_node_name(node) and node not in known]
    for node in new:
        append_jsonl(run.bad_nodes, dict(time=time.time(), node=node, why=named[node],
                                         job=job, cleared=False))
    return new


def clear_bad_nodes(run: RunFolder, nodes: list[str]) -> list[str]:
    """Clear the named nodes (all of them when `nodes` is empty); the ones cleared."""
    known = bad_nodes(run)
    cleared = [node for node in (nodes or known) if node in known]
    for node in cleared:
        append_jsonl(run.bad_nodes, dict(time=time.time(), node=node, why="cleared by a user",
                                         job="", cleared=True))
    return cleared


def bad_node_lines(run: RunFolder) -> list[str]:
    """A line per bad node: which, why, when, the job that named it."""
    return [f"{node}: {shown(record['why'])} (job {shown(record['job'], 20)}, "
            f"{time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime(record['time']))})"
            for node, record in sorted(bad_nodes(run).items())]


def attempt_line(record: dict) -> str:
    """An attempt as diagnose prints it: the job, how the step ended, the decision."""
    where = f" on {','.join(map(shown, record['nodes']))}" if record["nodes"] else ""
    left = (f", leaving {','.join(map(shown, record['exclude']))} behind"
            if record["exclude"] else "")
    reasons = "; ".join(shown(reason, 400) for reason in record["reasons"])
    return (f"job {shown(record['job'], 20)}, {shown(record['ending'], 20)} (status "
            f"{record['status']}): {shown(record['action'], 20)}{where}{left}: {reasons}")
