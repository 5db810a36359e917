"""The GPU check's report: gpu-check.json and gpu-check.md, written again after every part.

Each part (install, tests, bench) is a record with its status (passed, failed, stopped,
not run, or started: the kit was ended before the part did), its seconds and a note
("stopped after 450 s (the part's limit)"), and the `run` it belongs to. A part this run
did not ask for keeps the record of the run that made it, shown as from that run; a part
it asked for is never shown with an earlier run's rows. Standard library only.
"""

from __future__ import annotations

import json
import os
import time
import xml.etree.ElementTree as ElementTree
from pathlib import Path

PARTS = ("install", "tests", "bench")
OUTCOMES = ("PASSED", "FAILED", "SKIPPED", "ERROR", "XFAIL", "XPASS")


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def part_record(finished, why_limit: str) -> dict:
    """Status, seconds and note of a part that ran (a `Finished`)."""
    if finished.stopped:
        status, note = "stopped", f"stopped after {finished.limit_s:.0f} s ({why_limit})"
    elif finished.exit_status != 0:
        status, note = "failed", f"exit status {finished.exit_status}"
    else:
        status, note = "passed", ""
    return dict(status=status, seconds=round(finished.seconds, 1),
                exit_status=finished.exit_status, note=note)


def not_run(why: str) -> dict:
    return dict(status="not run", seconds=0.0, note=why)


class Report:
    """The report of one run, merged with the parts of earlier runs this one leaves alone."""

    def __init__(self, out: Path, header: dict, parts_asked: tuple[str, ...]):
        self.out = out
        previous = read_previous(out / "gpu-check.json")
        self.data = dict(header, date=now())
        for part in PARTS:
            if part in parts_asked:
                self.data[part] = dict(status="started", run=self.data["date"],
                                       note="the kit was ended before this part finished")
            elif part in previous:
                self.data[part] = previous[part]

    def set(self, part: str, record: dict) -> None:
        self.data[part] = dict(record, run=self.data["date"])
        self.write()

    def write(self) -> None:
        _write_atomic(self.out / "gpu-check.json", json.dumps(self.data, indent=2) + "\n")
        _write_atomic(self.out / "gpu-check.md", markdown(self.data))


def read_previous(path: Path) -> dict:
    """The part records of an earlier report; none from an unreadable or older format."""
    try:
        earlier = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return {part: earlier[part] for part in PARTS if isinstance(earlier.get(part), dict)
            and {"status", "run"} <= earlier[part].keys()}


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def read_junit(path: Path) -> dict:
    """passed/failed/skipped counts, and each failure and skip named with its message (a
    test a stop interrupted is left as an empty, nameless testcase: not counted)."""
    failures, skips, total = [], [], 0
    for case in ElementTree.parse(path).getroot().iter("testcase"):
        if case.get("name") is None:
            continue
        total += 1
        name = f"{case.get('classname')}::{case.get('name')}"
        problem = case.find("failure")
        problem = problem if problem is not None else case.find("error")
        if problem is not None:
            failures.append(dict(test=name, message=(problem.get("message") or "")[:300]))
        elif (skip := case.find("skipped")) is not None:
            skips.append(dict(test=name, reason=skip.get("message", "")))
    return dict(passed=total - len(failures) - len(skips), failed=len(failures),
                skipped=len(skips), failures=failures, skips=skips)


def running_test(log_text: str) -> str | None:
    """The test pytest -v had started and not finished: the one a stop interrupted."""
    running = None
    for line in log_text.splitlines():
        words = line.split()
        if words and "::" in words[0] and not line.startswith(" "):
            running = None if any(w in OUTCOMES for w in words[1:]) else words[0]
    return running


# ---------------------------------------------------------------- gpu-check.md
def markdown(report: dict) -> str:
    versions = ", ".join(f"{k} {'-' if v is None else v}"
                         for k, v in (report.get("versions") or {}).items())
    lines = [f"# GPU check: {report.get('device') or 'device not read (see facts.log)'}", "",
             f"{report['date']}; driver {report.get('driver') or '-'}; {versions or '-'}; "
             f"{'quick' if report['quick'] else 'full'} sizes", ""]
    for part, title in (("install", "Install"),
                        ("tests", "Tests (`pytest -m gpu tests/gpu`)"),
                        ("bench", "Benchmark (`python -m workload.bench.kit`)")):
        if part in report:
            lines += part_heading(title, report[part], report["date"])
            lines += (tests_lines if part == "tests" else bench_lines if part == "bench"
                      else install_lines)(report[part])
    return "\n".join(lines) + "\n"


def part_heading(title: str, record: dict, run: str) -> list[str]:
    status = record["status"] if record["status"] == "passed" else record["status"].upper()
    said = "; ".join(filter(None, [status, record.get("note"),
                                   f"{record['seconds']:.0f} s" if record.get("seconds") else ""]))
    earlier = "" if record.get("run") == run else f" (from the run of {record.get('run')})"
    return [f"## {title}: {said}{earlier}", ""]


def install_lines(record: dict) -> list[str]:
    lines = [f"- {line}" for line in record.get("log_tail", [])]
    return lines + [""] if lines else []


def tests_lines(record: dict) -> list[str]:
    if "passed" not in record:
        return []
    lines = [f"{record['passed']} passed, {record['failed']} failed, {record['skipped']} "
             "skipped", ""]
    if record.get("running"):
        lines += [f"- stopped while running: `{record['running']}`"]
    lines += [f"- failed: `{f['test']}`: {f['message']}" for f in record["failures"]]
    lines += [f"- skipped: `{s['test']}`: {s['reason']}" for s in record["skips"]]
    return lines + [""]


def bench_lines(record: dict) -> list[str]:
    lines = data_lines(record["data"]) if record.get("data") else []
    if rows := record.get("rows"):
        lines += rows_lines(rows, record.get("choice") or {})
    measured = {r["model"] for r in rows or []} | {e["part"] for e in record.get("errors", [])}
    missing = [m for m in (record.get("sizes") or {}).get("models", {}) if m not in measured]
    lines += [f"- failed: {e['part']}: {e['error']}" for e in record.get("errors", [])]
    lines += [f"- not measured: {m}" for m in missing]
    unfinished = [part for part in record.get("parts", [])
                  if part not in record.get("parts_done", []) and part not in missing]
    # stopped by the part's limit, or by the kit itself at its --time-limit just before
    lines += unfinished_lines(unfinished, stopped=record.get("status") == "stopped"
                              or bool(record.get("stopped")))
    if record.get("first_step"):
        lines += ([""] if lines and lines[-1] else []) + first_step_lines(record["first_step"])
    if record.get("profile"):
        lines += ([""] if lines and lines[-1] else []) + profile_lines(record["profile"])
    elif record.get("status") != "not run":
        lines += ["- profile: not measured", ""]
    return lines


def unfinished_lines(parts: list[str], stopped: bool) -> list[str]:
    """The parts that did not end. The kit runs them in order, so where the part was
    stopped at its limit the first of them was running then, cut short, not unreached."""
    running = parts[:1] if stopped else []
    return ([f"- stopped while running: {part}" for part in running]
            + [f"- not reached: {part}" for part in parts[len(running):]])


def rows_lines(rows: list[dict], choice: dict) -> list[str]:
    """One line per model and config: its figures, or why it has none."""
    lines = ["| model | config | images/s | x reference | MFU | precision | J/image "
             "| compile s | step GiB |",
             "| --- | --- | ---: | ---: | ---: | --- | ---: | ---: | ---: |"]
    for r in rows:
        if r["status"] != "measured":
            lines.append(f"| {r['model']} | {r['config']} | {r['status']}: {r['reason']} "
                         "| | | | | | |")
            continue
        lines.append(f"| {r['model']} | {r['config']} | {r['images_per_second']:,.1f} "
                     f"| {number(r['ratio'], '.2f')} | {percent(r['mfu'])} | {r['precision']} "
                     f"| {number(r['energy_j_per_image'], '.4f')} | {number(r['compile_s'], '.1f')}"
                     f" | {number(r['peak_step_memory_gib'], '.2f')} |")
    lines += ["", "MFU: achieved TFLOP/s over the GPU's dense bf16 datasheet peak. J/image: "
              "the GPU board's energy counter (NVML) over the timed steps. step GiB: the "
              "step's peak memory above what the process held before it.", ""]
    lines += [f"- bench would choose for {model}: {c['config']} ({c['why']})"
              for model, c in choice.items()]
    return lines + [""]


def first_step_lines(part: dict) -> list[str]:
    """The starts of train (cold, warm, cuDNN's settings): each phase in seconds."""
    starts = part.get("starts", [])
    phases = list(dict.fromkeys(name for s in starts for name in s.get("phases_s") or {}))
    lines = ["### The first step, taken apart (`train` started as a new process each)", "",
             "| start | " + " | ".join(phases) + " | to first step | images/s after |",
             "| --- |" + " ---: |" * (len(phases) + 2)]
    for s in starts:
        if s["status"] != "measured":
            lines.append(f"| {s['name']} | {s['status']}: {s['reason']} |")
            continue
        cells = [number(s["phases_s"].get(name), ".2f") for name in phases]
        lines.append(f"| {s['name']} | " + " | ".join(cells) + f" | "
                     f"{number(s['to_first_step_s'], '.2f')} | "
                     f"{number(s['images_per_second'], ',.1f')} |")
    # CUDA's context starts in a thread of its own during the imports (training/startup.py)
    lines += [""] + [f"- {s['name']}: CUDA's context began {c['started']:.2f} s and was ready "
                     f"{c['ready']:.2f} s after the process start" for s in starts
                     if (c := s.get("cuda_context_s"))]
    return lines + ["", f"Command: `{' '.join(part.get('command', []))}`", ""]


def number(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def data_lines(data: dict) -> list[str]:
    sizes = ", ".join(f"{model} {s}x{s}" for model, s in data["image_size"].items())
    return [f"Data: {data['kind']}, {data['shaped_as']}-shaped: {data['images']:,} images of "
            f"{data['channels']} channels ({sizes}), {data['classes']} classes; {data['note']}.",
            ""]


def percent(share: float | None) -> str:
    return "-" if share is None else f"{100 * share:.1f} %"


def profile_lines(profile: dict) -> list[str]:
    lines = [f"### One train step, profiled ({profile['model']}, batch "
             f"{profile['batch_size']}, {profile['precision']}; shares of {profile['basis']})",
             "", "| phase | ms | share |", "| --- | ---: | ---: |"]
    lines += [f"| {name} | {p['ms']:,.2f} | {percent(p['share'])} |"
              for name, p in profile["phases"].items()]
    syncs = profile["host_syncs"]
    lines += ["", f"Host synchronisations inside the steps: {syncs['total']} "
              f"({', '.join(f'{k} {v}' for k, v in syncs['by_name'].items()) or 'none'}).", "",
              "| top operators and kernels (self time) | ms | calls |", "| --- | ---: | ---: |"]
    lines += [f"| `{op['name'][:80]}` | {op['self_ms']:,.2f} | {op['calls']} |"
              for op in profile["top"]]
    return lines + [""]
