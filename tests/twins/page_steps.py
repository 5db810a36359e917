"""The steps of a site page: the fenced shell blocks a user runs, in order.

A step is a fenced block right after a marker comment (docs/development.md, "Site pages
are tests"):

    <!-- step: login -->                       typed at the login node's shell
    <!-- step: batch jobs/sites/X.sbatch -->   the body of a batch script whose #SBATCH
                                               header is that file's
    <!-- step: continue -->                    typed at the login node's shell once the
                                               jobs before it have ended: the page's
                                               resubmission that continues a run, <jobid>
                                               the run's first job

The block may be indented (a fence inside a numbered list); its lines lose the fence's
indentation. A marker not followed by a fence is an error, so a step cannot silently drop
out of the test. A shell block that is no step says why, right above its fence:

    <!-- not a step: REASON -->                what the twin cannot run, and why

and `unmarked_blocks` finds a shell block with neither marker (the suite fails on one).
"""

from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass

MARKER = re.compile(r"^\s*<!-- step: (?P<kind>login|batch|continue)(?: (?P<header>\S+))? -->\s*$")
FENCE = re.compile(r"^(?P<indent>\s*)```")
SHELL_FENCE = re.compile(r"^\s*```(bash|sh|shell|console)\s*$")
NOT_A_STEP = re.compile(r"^\s*<!-- not a step: \S.*\S -->\s*$")


@dataclass(frozen=True)
class Step:
    kind: str           # login | batch | continue
    header: str | None  # batch: the job script whose #SBATCH lines head the block
    text: str
    line: int           # the fence's line in the page (1-based), for messages


def page_steps(page: str) -> list[Step]:
    """The page's marked blocks, in the order they appear."""
    lines, steps = page.splitlines(), []
    for number, line in enumerate(lines):
        marker = MARKER.match(line)
        if not marker:
            continue
        fence = FENCE.match(lines[number + 1]) if number + 1 < len(lines) else None
        if not fence:
            raise ValueError(f"line {number + 1}: a step marker must be followed by a ``` "
                             f"fence on the next line, found {lines[number + 1:number + 2]!r}")
        if (marker["kind"] == "batch") != bool(marker["header"]):
            raise ValueError(f"line {number + 1}: `batch` names its header file "
                             "(<!-- step: batch jobs/sites/X.sbatch -->), `login` and "
                             "`continue` name none")
        body = []
        for row in lines[number + 2:]:
            if row.strip().startswith("```"):
                break
            body.append(row)
        else:
            raise ValueError(f"line {number + 2}: the step's fence is never closed")
        steps.append(Step(marker["kind"], marker["header"],
                          textwrap.dedent("\n".join(body)) + "\n", number + 2))
    return steps


def unmarked_blocks(page: str) -> list[int]:
    """The lines (1-based) of shell fences with no marker above them: neither a step nor
    a `not a step: REASON`."""
    lines = page.splitlines()
    return [number + 1 for number, line in enumerate(lines)
            if SHELL_FENCE.match(line) and not (number and any(
                marker.match(lines[number - 1]) for marker in (MARKER, NOT_A_STEP)))]
