"""Reading launch variables: whole numbers (named with their fix when they are not one),
SLURM's node lists and task counts, what SLURM says of this step (ranks, first node,
port), and where this process runs (a SLURM job, a job step, torchrun, the submit folder).

SLURM's compressed notation (``nid[001-004]``, ``gpu[01-02]-ib[0-1]``, ``a1,b[2-3]``, task
counts such as ``2(x3),1``) is expanded with python-hostlist, never scontrol: scontrol is
usually missing inside containers.

Relative paths that would land inside a container, the pyxis/enroot pitfall: pyxis
(``srun --container-image=...``) starts the task in the image's WORKDIR, not in the folder
the job was submitted from, and the container's root file system is writable and thrown
away at the end of the job. A relative ``--output-dir`` (the default
``runs/<time>``) or ``--data-dir`` (default ``data``) then resolves inside the container:
the run is written, and lost, without an error. Apptainer keeps the submit folder as the
current folder, so there the same paths are fine.
"""

from __future__ import annotations

import os
import re
import socket
from pathlib import Path
from collections.abc import Mapping

import hostlist

from workload.errors import LaunchError

# Every launch number (a rank, a port, a job id, a CPU count) fits in 18 digits.
MAX_DIGITS = 18
WHOLE_NUMBER = re.compile(rf"[0-9]{{1,{MAX_DIGITS}}}")
# MASTER_PORT = PORT_BASE + 10 * (job id mod 1000) + step slot: below Linux's ephemeral
# range (32768+), distinct for up to 10 concurrent steps of one job and for jobs whose
# ids differ by less than 1000. The batch script itself (no step) uses slot 9.
PORT_BASE = 20000
PORT_LAST = 29999
BATCH_STEP_SLOT = 9


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


def node_name() -> str:
    """This node in messages: SLURM's name for it when there is one (several slurmd
    "nodes" may share a host, as on test clusters), else the short host name."""
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]


def under_torchrun(env: Mapping[str, str]) -> bool:
    """torchrun (torch.distributed.run) sets these for every worker it starts."""
    return "TORCHELASTIC_RUN_ID" in env or "TORCHELASTIC_RESTART_COUNT" in env


# ------------------------------------------------------------------ SLURM node lists
def expand_nodes(name: str, value: str) -> list[str]:
    """All host names of a SLURM node list, in SLURM's order."""
    try:
        hosts = hostlist.expand_hostlist(value)
    except (hostlist.BadHostlist, ValueError) as exc:
        # ValueError: int() of a range bound past 4300 digits, not a hostlist error.
        why = exc if isinstance(exc, hostlist.BadHostlist) else "a number in it is too long"
        raise LaunchError(name, value, f"a SLURM node list such as nid[001-004] ({why})",
                          f"unset {name} or fix its value") from None
    if not hosts:
        raise LaunchError(name, value, "a non-empty SLURM node list", f"unset {name}")
    return hosts


def first_node(name: str, value: str) -> str:
    return expand_nodes(name, value)[0]


def tasks_per_node(name: str, value: str) -> list[int]:
    """``2(x3),1`` -> [2, 2, 2, 1]: the task count of every node in the step."""
    try:
        counts = hostlist.parse_slurm_tasks_per_node(value)
    except (ValueError, hostlist.BadHostlist):
        counts = []
    if not counts or any(count < 1 for count in counts):
        raise LaunchError(name, value, "SLURM task counts such as 4(x2),2",
                          f"unset {name} or fix its value")
    return counts


# ------------------------------------------------------------------ SLURM values
def slurm_master_addr(env: Mapping[str, str]) -> str | None:
    """First host of the step's node list, else of the job's (het group 0 first)."""
    for name in ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST_HET_GROUP_0",
                 "SLURM_JOB_NODELIST", "SLURM_NODELIST"):
        if env.get(name):
            return first_node(name, env[name])
    return None


def slurm_port(env: Mapping[str, str]) -> int | None:
    job = first_whole_number(env, "SLURM_JOB_ID", "SLURM_JOBID")
    if job is None:
        return None
    step = first_whole_number(env, "SLURM_STEP_ID", "SLURM_STEPID") if in_step(env) else None
    slot = BATCH_STEP_SLOT if step is None else step % 10
    return PORT_BASE + 10 * (job % 1000) + slot


def slurm_world(env: Mapping[str, str]) -> dict[str, int | None]:
    """Rank layout from SLURM: step variables first, then the job's."""
    if not in_step(env):
        # The batch script or an salloc shell: one process, whatever the job's task count.
        return dict(RANK=0, LOCAL_RANK=0, WORLD_SIZE=1, LOCAL_WORLD_SIZE=1, NODE_RANK=0,
                    NUM_NODES=1)
    node_rank = whole_number(env, "SLURM_NODEID")
    return dict(
        RANK=whole_number(env, "SLURM_PROCID"),
        LOCAL_RANK=whole_number(env, "SLURM_LOCALID"),
        WORLD_SIZE=first_whole_number(env, "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_NPROCS",
                              minimum=1),
        LOCAL_WORLD_SIZE=_tasks_on_node(env, node_rank or 0),
        NODE_RANK=node_rank,
        NUM_NODES=first_whole_number(env, "SLURM_STEP_NUM_NODES", "SLURM_NNODES", minimum=1),
    )


def _tasks_on_node(env: Mapping[str, str], node_rank: int) -> int | None:
    for name in ("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"):
        if env.get(name):
            counts = tasks_per_node(name, env[name])
            return counts[node_rank] if node_rank < len(counts) else None
    return whole_number(env, "SLURM_NTASKS_PER_NODE", minimum=1)


# ------------------------------------------------------------------ the submit folder
def outside_submit_dir(paths: Mapping[str, str], env: Mapping[str, str],
                       cwd: str | Path) -> list[str]:
    """A warning, with its fix, for each relative path of `paths` (flag -> value) when
    this SLURM task does not run in the submit folder (SLURM_SUBMIT_DIR)."""
    submit = env.get("SLURM_SUBMIT_DIR")
    if not (in_slurm(env) and submit) or _same(cwd, submit):
        return []
    return [f"{flag} {value} is relative to the current folder {cwd}, not to the folder "
            f"the job was submitted from ({submit}): it lands under {cwd}, and where that "
            f"is inside the container (pyxis starts in the image's WORKDIR) it is lost "
            f"when the job ends; pass an absolute path on a mounted file system "
            f"(e.g. {flag} {Path(submit) / value}) or start the task in the submit folder "
            f"(pyxis: srun --container-workdir=\"$PWD\" --container-mounts=\"$PWD\"; "
            f"CSCS's Container Engine: the EDF's workdir)"
            for flag, value in paths.items() if value and not os.path.isabs(value)]


def _same(a: str | Path, b: str | Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:  # the submit folder is not even visible here
        return False
