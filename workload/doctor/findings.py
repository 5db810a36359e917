"""What a check reports: a status, one line of detail, and the fix when something is wrong."""

from __future__ import annotations

from dataclasses import asdict, dataclass

OK, INFO, WARN, FAIL = "ok", "info", "warn", "fail"
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
