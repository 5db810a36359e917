"""What a check reports (a status, one line of detail, and the fix when something is
wrong) and rank 0's report of them all: the rank map as one table, then the findings
grouped across ranks, on stdout and as JSON."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

from workload.files import write_json

OK = "ok"
INFO = "info"
WARN = "warn"
FAIL = "fail"
SEVERITY = {OK: 0, INFO: 0, WARN: 1, FAIL: 2}


@dataclass(frozen=True)
class Finding:
    check: str        # short name: gpu, shm, dali, tf32, threads, writable, ...
    status: str       # ok, info, warn (worth fixing) or fail (the job would not work)
    detail: str       # what was found, with the values
    fix: str = ""     # the flag, variable or command that fixes it (warn and fail)

    def to_dict(self) -> dict:
        return asdict(self)


def worst(findings) -> str:
    """ok, warn or fail: the overall status. info counts as ok (never returned itself)."""
    top = max((SEVERITY[f.status] for f in findings), default=0)
    return {0: OK, 1: WARN, 2: FAIL}[top]


def cpu_ranges(cpus) -> str:
    """{0, 1, 2, 5} -> "0-2,5": the CPU binding as taskset and numactl print it."""
    parts = []
    for cpu in sorted(cpus):
        if parts and cpu == parts[-1][1] + 1:
            parts[-1][1] = cpu
        else:
            parts.append([cpu, cpu])
    return ",".join(f"{a}-{b}" if a != b else str(a) for a, b in parts)


# The rank map's columns: (title, key in a rank's place).
COLUMNS = (("rank", "rank"), ("node", "node"), ("local", "local_rank"), ("device", "device"),
           ("name", "device_name"), ("cpus", "cpus"), ("threads", "threads"), ("pid", "pid"))


def rank_table(rank_map: list[dict]) -> list[str]:
    rows = [[title for title, _ in COLUMNS]]
    rows += [[str(place[key]) for _, key in COLUMNS] for place in rank_map]
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]


def grouped(findings: list[tuple[int, object]]) -> list[tuple[object, list[int]]]:
    """Identical findings of several ranks once, with the ranks that reported them."""
    groups: dict[object, list[int]] = {}
    for rank, finding in findings:
        groups.setdefault(finding, []).append(rank)
    return list(groups.items())


def print_report(outcome: dict, out) -> None:
    rank_map = outcome["ranks"]
    if rank_map:
        nodes = len({place["node"] for place in rank_map})
        print(f"doctor: {plural(len(rank_map), 'rank')} on {plural(nodes, 'node')}, backend "
              f"{outcome.get('backend') or 'none (one process)'}", file=out)
        for line in rank_table(rank_map):
            print("  " + line, file=out)
    if outcome.get("versions"):
        print("versions: " + ", ".join(f"{k} {v}" for k, v in outcome["versions"][0].items()),
              file=out)
    many = len(rank_map) > 1
    for finding, ranks in grouped(outcome["findings"]):
        who = f" [rank{'s' if len(ranks) > 1 else ''} {cpu_ranges(ranks)}]" if many else ""
        print(f"{finding.status:>5}  {finding.check}{who}: {finding.detail}", file=out)
        if finding.fix and SEVERITY[finding.status] > 0:
            print(f"       fix: {finding.fix}", file=out)
    findings = [f for _, f in outcome["findings"]]
    failed = sorted({f.check for f in findings if f.status == FAIL})
    warned = sorted({f.check for f in findings if f.status == WARN})
    verdict = {FAIL: "NOT READY", WARN: "ready, with warnings", OK: "ready"}
    print(f"doctor: {verdict[worst(findings)]}: {len(failed)} failed ({', '.join(failed) or '-'}), "
          f"{plural(len(warned), 'warning')} ({', '.join(warned) or '-'})", file=out)


def plural(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


def write_json_report(path: Path, outcome: dict) -> None:
    findings = [dict(rank=rank, **finding.to_dict()) for rank, finding in outcome["findings"]]
    write_json(path, dict(
        status=worst(f for _, f in outcome["findings"]), world_size=outcome["world_size"],
        backend=outcome.get("backend"), ranks=outcome["ranks"],
        allreduce=outcome.get("allreduce"), versions=outcome.get("versions", []),
        gpus=outcome.get("gpus", []),
        findings=findings))
