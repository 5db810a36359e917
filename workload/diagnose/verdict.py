"""The verdict: which ranks held the others up, from the checked records of the ranks of
the newest attempt (a resumed run leaves its earlier attempts' heartbeats behind)."""

from __future__ import annotations

import time
from pathlib import Path

from workload.diagnose.reading import read_folder
from workload.diagnose.records import HEARTBEAT_KEYS, shown
from workload.launch.diagnostics import FINISHED, STARTUP_PHASES

LISTED = 20  # rank groups named in a line; the rest counted
PATH_CHARS = 1000  # a folder's path as printed


def diagnosis(run_dir: Path) -> dict:
    """What `diagnose RUN_DIR` says: the newest attempt's ranks, the suspects and the
    verdict, each rank's line, the files left out."""
    folder = read_folder(run_dir)
    ranks, world, left_out = this_attempt(folder.ranks)
    found, why = suspects(ranks, world)
    return dict(folder=shown(folder.path, PATH_CHARS), suspect_ranks=found,
                verdict=verdict(ranks, found, why),
                ranks={str(rank): r for rank, r in sorted(ranks.items())},
                lines=[describe(r) for _, r in sorted(ranks.items())],
                left_out=left_out, skipped=folder.skipped, torch_dumps=folder.pickled)


def this_attempt(ranks: dict[int, dict]) -> tuple[dict[int, dict], int, list[str]]:
    """The ranks of the newest attempt (the newest heartbeat's attempt id and world size),
    its world size, and a line for each kind of file of an earlier attempt left out."""
    beats = [r for r in ranks.values() if "step" in r]
    if not beats:
        return ranks, max(ranks, default=-1) + 1, []
    newest = max(beats, key=lambda r: (r.get("attempt", 0), r.get("time", 0)))
    attempt = newest.get("attempt")
    world = newest["world_size"]
    outside = sorted(rank for rank in ranks if rank >= world)
    kept = {rank: r for rank, r in ranks.items() if rank < world}
    stale = sorted(rank for rank, r in kept.items() if "step" in r and
                   (r.get("attempt") != attempt or r["world_size"] != world))
    for rank in stale:
        kept[rank] = {key: value for key, value in kept[rank].items()
                      if key not in HEARTBEAT_KEYS}
    lines = [f"the files of {rank_list(outside)}: not ranks of the newest attempt, which "
             f"has {world}"] if outside else []
    lines += [f"the heartbeats of {rank_list(stale)}: an earlier attempt's (its id or "
              "world size differs from the newest heartbeat's)"] if stale else []
    return kept, world, lines


def suspects(ranks: dict[int, dict], world: int) -> tuple[list[int], str]:
    """The ranks that held the others up, and why (empty when nothing points to one)."""
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


def verdict(ranks: dict[int, dict], found: list[int], why: str) -> str:
    if found:
        return f"{rank_list(found)} {why}"
    if ranks and all(r.get("phase") == FINISHED for r in ranks.values()):
        return "every rank finished: its last heartbeat says so"
    return "nothing points to one rank"


def rank_list(ranks: list[int]) -> str:
    """"rank 3", "ranks 2, 3", "ranks 2-9, 12": runs of three or more as a range, at most
    LISTED groups named (a world size can be large)."""
    groups: list[list[int]] = []  # [first, last] of each run
    for rank in sorted(ranks):
        if groups and rank == groups[-1][1] + 1:
            groups[-1][1] = rank
        else:
            groups.append([rank, rank])
    named = groups[:LISTED]
    text = ", ".join(f"{first}-{last}" if last - first > 1 else
                     ", ".join(map(str, range(first, last + 1))) for first, last in named)
    left = len(ranks) - sum(last - first + 1 for first, last in named)
    return f"rank{'s' if len(ranks) > 1 else ''} {text}" + (f" and {left} more" if left else "")


def describe(r: dict) -> str:
    """One rank's line: where it was, what it was doing and waiting in."""
    line = (f"rank {r['rank']} on {r.get('host', '?')} (pid {r.get('pid', '?')}): step "
            f"{r.get('step', '?')}, phase {r.get('phase', '?')}")
    line += ", stalled" if is_stalled(r) else ", no stall dump"
    if r.get("waiting_in"):
        line += f", waiting in {r['waiting_in']}"
    if r.get("frames"):
        line += f"; main thread in {r['frames'][0]}"
    if "startup_at" in r and "step" not in r:
        line += "; " + start_up(r["startup_last"], r["startup_at"])
    return line


def start_up(last: str | None, at: float) -> str:
    """Where a rank that never took a step was in its start (train's marks)."""
    when = time.strftime("%H:%M:%S UTC", time.gmtime(at))
    if last is None:
        return f"started at {when}, finished no start-up phase"
    if last == STARTUP_PHASES[-1]:
        return f"took its first step at {when}"
    following = STARTUP_PHASES[STARTUP_PHASES.index(last) + 1]
    return f"start-up: finished {last} at {when}, then in {following}"
