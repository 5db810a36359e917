"""`diagnose`: which rank held a hung or stalled job up, what it was doing, and what the
others waited in, from what the ranks left in <RUN_DIR>/diagnostics (docs/hangs.md).

After a job stopped on a timeout, or while it hangs (the login node is fine; it reads
files only):
    diagnose runs/wrn                 # the verdict, one line per rank
    diagnose runs/wrn --json          # the same as JSON: suspect_ranks, ranks, verdict
    apptainer exec image.sif diagnose $SCRATCH/runs/wrn

It reads each rank's heartbeat (heartbeat-<N>.json: step, phase, host), its stall dump
(rank-<N>.txt: every thread's stack, written by the stall watchdog or on SIGUSR1) and its
flight recorder copy (fr-rank-<N>.json: the collectives it entered). torch's own dumps on
a collective timeout (fr-rank-<N>, pickles) are never unpickled here: it names the command
of torch's analyser for them. Exit status: 0 a verdict, 1 nothing points to a rank,
2 no diagnostics folder.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from workload.commands import command_parser, main_of
from workload.errors import UsageError
from workload.files import strict_json
from workload.launch.diagnostics import DIAGNOSTICS, FR_PREFIX, STALL_MARK

PROG = "diagnose"
NO_VERDICT = 1
_RANK_FILE = re.compile(r"(heartbeat-|rank-|fr-rank-)(\d+)(\.json|\.txt)?$")
_FRAME = re.compile(r'File "(.+)", line (\d+) in (\S+)')


def read_json(path: Path) -> dict | None:
    try:
        data = strict_json(path.read_text())
    except (OSError, ValueError, RecursionError):
        return None  # a file half written when the job died: left out, not fatal
    return data if isinstance(data, dict) else None


def last_dump(text: str) -> dict:
    """The last dump of a rank-<N>.txt: its header (a stall's) and the main thread's
    innermost frames."""
    block = text[max(0, text.rfind(STALL_MARK)):]  # an on-demand dump has no header
    header = block.splitlines()[0] if block.startswith(STALL_MARK) else ""
    threads = re.split(r"\n(?=Thread 0x|Current thread)", block)
    main = next((t for t in threads if "in <module>" in t), threads[-1])
    frames = [f"{Path(m[0]).name}:{m[1]} {m[2]}" for m in _FRAME.findall(main)]
    return dict(header=header, frames=frames[:4])


def flight(record: dict) -> dict:
    """What the flight recorder says: the last collective this rank entered, and the one
    it waits in (entered, not completed)."""
    entries = record.get("entries") or []
    pending = [e for e in entries if not e.get("retired", True)]
    last = entries[-1] if entries else {}
    waiting = pending[-1] if pending else None
    return dict(last_collective=last.get("collective_seq_id"),
                waiting_in=(f"{waiting.get('profiling_name')} (collective "
                            f"{waiting.get('collective_seq_id')})") if waiting else None)


def read_folder(folder: Path) -> tuple[dict[int, dict], list[str]]:
    """Per rank, what its files say; and torch's own (pickled) dumps, by name."""
    ranks: dict[int, dict] = {}
    pickled = []
    for path in sorted(folder.iterdir()):
        match = _RANK_FILE.match(path.name)
        if not match:
            continue
        kind, rank, suffix = match.group(1), int(match.group(2)), match.group(3)
        found = ranks.setdefault(rank, {"rank": rank})
        if kind == "heartbeat-" and suffix == ".json":
            found.update(read_json(path) or {})
        elif kind == "rank-" and suffix == ".txt":
            found.update(last_dump(path.read_text(errors="replace")))
        elif kind == FR_PREFIX and suffix == ".json":
            found.update(flight(read_json(path) or {}))
        elif kind == FR_PREFIX and suffix is None:
            pickled.append(path.name)
    return ranks, pickled


def suspects(ranks: dict[int, dict]) -> tuple[list[int], str]:
    """The ranks that held the others up, and why (empty when nothing points to one)."""
    world = max([r.get("world_size", 0) for r in ranks.values()] + [len(ranks)])
    missing = [rank for rank in range(world) if "step" not in ranks.get(rank, {})]
    stalled = {rank for rank, r in ranks.items() if is_stalled(r)}
    if stalled:
        silent = sorted(set(range(world)) - stalled)
        if silent:
            return silent, ("wrote no stall dump while the others did: frozen, dead, or "
                            "stuck where Python cannot run")
    if missing:
        return missing, "left no heartbeat: never started training, or its node failed"
    behind = behind_ranks(ranks, "step")
    if behind:
        return behind, "is behind the others in steps"
    behind = behind_ranks(ranks, "last_collective")
    if behind:
        return behind, "did not enter the collective the others wait in"
    return [], ""


def is_stalled(r: dict) -> bool:
    """The heartbeat says whether the rank's latest stall is still on (an old dump in
    rank-<N>.txt, from before it moved on, is not); without one, the dump does."""
    return bool(r.get("stalled", r.get("header")))


def behind_ranks(ranks: dict[int, dict], key: str) -> list[int]:
    values = {rank: r[key] for rank, r in ranks.items() if isinstance(r.get(key), int)}
    if len(set(values.values())) < 2:
        return []
    lowest = min(values.values())
    return sorted(rank for rank, value in values.items() if value == lowest)


def describe(r: dict) -> str:
    """One rank's line: where it was, what it was doing and waiting in."""
    line = (f"rank {r['rank']} on {r.get('host', '?')} (pid {r.get('pid', '?')}): step "
            f"{r.get('step', '?')}, phase {r.get('phase', '?')}")
    line += ", stalled" if is_stalled(r) else ", no stall dump"
    if r.get("waiting_in"):
        line += f", waiting in {r['waiting_in']}"
    if r.get("frames"):
        line += f"; main thread in {r['frames'][0]}"
    return line


def diagnosis(run_dir: Path) -> dict:
    folder = run_dir / DIAGNOSTICS if (run_dir / DIAGNOSTICS).is_dir() else run_dir
    if not folder.is_dir():
        raise UsageError(f"RUN_DIR {run_dir} has no {DIAGNOSTICS} folder; pass the "
                         "--output-dir of a train run (or a script's ./diagnostics)")
    ranks, pickled = read_folder(folder)
    found, why = suspects(ranks)
    verdict = (f"rank{'s' if len(found) > 1 else ''} {', '.join(map(str, found))} {why}"
               if found else "nothing points to one rank")
    return dict(folder=str(folder), suspect_ranks=found, verdict=verdict,
                ranks={str(rank): r for rank, r in sorted(ranks.items())},
                lines=[describe(r) for _, r in sorted(ranks.items())],
                torch_dumps=pickled)


def print_diagnosis(result: dict) -> None:
    print(f"diagnose: {result['folder']}, {len(result['ranks'])} rank(s) left files")
    print(f"verdict: {result['verdict']}")
    for line in result["lines"]:
        print(f"  {line}")
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
