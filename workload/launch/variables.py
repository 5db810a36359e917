"""Reading launch variables: whole numbers (named with their fix when they are not one),
and where this process runs (a SLURM job, a job step, torchrun)."""

from __future__ import annotations

import re
from typing import Mapping

from workload.launch.errors import LaunchError

# Every launch number (a rank, a port, a job id, a CPU count) fits in 18 digits.
MAX_DIGITS = 18
WHOLE_NUMBER = re.compile(rf"[0-9]{{1,{MAX_DIGITS}}}")


def whole_number(env: Mapping[str, str], name: str, minimum: int = 0) -> int | None:
    """The variable `name` as a whole number >= `minimum`; None when it is unset or empty."""
    raw = env.get(name)
    if raw is None or raw == "":
        return None
    # The digit count is checked before int(): past 4300 digits int() raises its own error.
    if not WHOLE_NUMBER.fullmatch(raw.strip()) or int(raw) < minimum:
        raise LaunchError(name, raw, f"a whole number >= {minimum} of at most {MAX_DIGITS} "
                          f"digits", f"unset {name} or set it to a whole number")
    return int(raw)


def first_whole_number(env: Mapping[str, str], *names: str, minimum: int = 0) -> int | None:
    """The first of `names` that is set, as a whole number."""
    for name in names:
        value = whole_number(env, name, minimum)
        if value is not None:
            return value
    return None


def in_slurm(env: Mapping[str, str]) -> bool:
    return bool(env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID"))


def in_step(env: Mapping[str, str]) -> bool:
    """True inside an srun step; False in the batch script or an salloc shell."""
    return in_slurm(env) and bool(env.get("SLURM_STEP_ID") or env.get("SLURM_STEPID"))


def under_torchrun(env: Mapping[str, str]) -> bool:
    """torchrun (torch.distributed.run) sets these for every worker it starts."""
    return "TORCHELASTIC_RUN_ID" in env or "TORCHELASTIC_RESTART_COUNT" in env
