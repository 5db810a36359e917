"""What each file of a diagnostics folder says, checked: a heartbeat's fields by type and
range (the package's one table of bounds: workload.config.bounds), a stack dump's last
dump, a flight recorder record's collectives. Whatever comes out is safe to print
(shown()); a file that fails raises Skipped naming why."""

from __future__ import annotations

import re
from datetime import datetime
from pathlib import Path

from workload.config import out_of_range, record_problem
from workload.files import strict_json
from workload.launch.diagnostics import ERROR_CHARS, STALL_MARK, STARTUP_PHASES

TEXT_CHARS = 120             # a printed string is at most this long
# The time at the end of a stall dump's header: `at 2026-12-05T00:29:39+0000`.
_DUMPED_AT = re.compile(r" at ([0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}[+-][0-9]{4})$")
_FRAME = re.compile(r'File "(.+)", line ([0-9]+) in (\S+)', re.ASCII)
_NUMBER = (int, float)
# A heartbeat's fields: the types each may have (bool is no number here).
_HEARTBEAT = {"world_size": (int,), "step": (int,), "phase": (str,), "host": (str,),
              "pid": (int,), "time": _NUMBER, "median_step_s": (*_NUMBER, type(None)),
              "stalled": (bool,), "attempt": _NUMBER, "rank": (int,), "error": (str,)}
HEARTBEAT_KEYS = frozenset(_HEARTBEAT) - {"rank"}  # what a rank's record takes from it


class Skipped(Exception):
    """A file left out; str() says why."""


def shown(value: object, limit: int = TEXT_CHARS) -> str:
    """`value` as text that prints as one line of itself: control characters (newlines,
    terminal escapes) and other unprintable ones escaped, at most `limit` characters."""
    text = "".join(c if c.isprintable() else ascii(c)[1:-1] for c in str(value)[:limit + 1])
    return text if len(text) <= limit else f"{text[:limit]}... (shortened)"


def json_object(data: bytes) -> dict:
    try:
        value = strict_json(data.decode())
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise Skipped("not JSON (half written when the job died?)") from None
    if not isinstance(value, dict):
        raise Skipped("not a JSON object")
    return value


def heartbeat(data: bytes, rank: int) -> dict:
    """A heartbeat's fields, each of its type; the rank is the file name's."""
    beat = json_object(data)
    for key, types in _HEARTBEAT.items():
        value = beat.get(key)
        if key in beat and (isinstance(value, bool) and bool not in types
                            or not isinstance(value, types)):
            raise Skipped(f"{key} is {shown(repr(value), 40)}, not of the type it should be")
    for key in ("step", "world_size"):
        if key not in beat:
            raise Skipped(f"no {key}")
    if beat.get("rank", rank) != rank:
        raise Skipped(f"it says rank {beat['rank']}, its name rank {rank}")
    if problem := record_problem(beat, HEARTBEAT_KEYS):
        raise Skipped(shown(problem))
    if rank >= beat["world_size"]:
        raise Skipped(f"rank {rank} is not below its world size {beat['world_size']}")
    return {key: shown(beat[key], ERROR_CHARS if key == "error" else TEXT_CHARS)
            if isinstance(beat[key], str) else beat[key] for key in HEARTBEAT_KEYS if key in beat}


def startup(data: bytes, rank: int) -> dict:
    """train's start-up record: the last phase this rank finished, and when; and, when
    the start-up failed, the rank's error and its node."""
    record = json_object(data)
    last = record.get("last_phase")
    at = record.get("at")
    if (last not in (None, *STARTUP_PHASES) or not isinstance(at, _NUMBER)
            or isinstance(at, bool)):
        raise Skipped("not a start-up record (last_phase or at)")
    if problem := record_problem(record, ("at",)):
        raise Skipped(shown(problem))
    failed = {f"startup_{key}": shown(record[key], ERROR_CHARS) for key in ("error", "host")
              if isinstance(record.get(key), str)}
    return {"startup_last": last, "startup_at": at, **failed}


def last_dump(data: bytes, rank: int) -> dict:
    """The last dump of a rank-<N>.txt: its header (a stall's), when it was written, and
    the main thread's innermost frames."""
    text = data.decode(errors="replace")
    block = text[max(0, text.rfind(STALL_MARK)):]  # an on-demand dump has no header
    header = block.splitlines()[0] if block.startswith(STALL_MARK) else ""
    threads = re.split(r"\n(?=Thread 0x|Current thread)", block)
    main = next((t for t in threads if "in <module>" in t), threads[-1])
    frames = [shown(f"{Path(m[0]).name}:{m[1]} {m[2]}") for m in _FRAME.findall(main)[:4]]
    return dict(header=shown(header), frames=frames, **dumped_at(header))


def dumped_at(header: str) -> dict:
    """{"dumped_at": seconds since the epoch} from the time at the end of a stall dump's
    header (workload/training/watchdog.py), read before the header is shortened for
    printing, which cuts a long one's time off; {} without one."""
    match = _DUMPED_AT.search(header)
    try:
        when = datetime.strptime(match.group(1), "%Y-%m-%dT%H:%M:%S%z") if match else None
    except ValueError:  # a month 13, a year 0
        return {}
    return {"dumped_at": when.timestamp()} if when else {}


def flight(data: bytes, rank: int) -> dict:
    """What the flight recorder says: the last collective this rank entered, and the one
    it waits in (entered, not completed)."""
    entries = json_object(data).get("entries", [])
    if not isinstance(entries, list) or not all(map(_is_entry, entries)):
        raise Skipped("entries is not a list of collectives (objects with a whole "
                      "collective_seq_id, a profiling_name and retired true or false)")
    pending = [e for e in entries if not e.get("retired", True)]
    last = entries[-1] if entries else {}
    waiting = pending[-1] if pending else None
    return dict(last_collective=last.get("collective_seq_id"),
                waiting_in=shown(f"{waiting.get('profiling_name')} (collective "
                                 f"{waiting.get('collective_seq_id')})") if waiting else None)


def _is_entry(entry: object) -> bool:
    if not isinstance(entry, dict):
        return False
    seq, name, retired = (entry.get(key) for key in ("collective_seq_id", "profiling_name",
                                                      "retired"))
    return (not out_of_range("collective_seq_id", seq)
            and (name is None or isinstance(name, str))
            and (retired is None or isinstance(retired, bool)))
