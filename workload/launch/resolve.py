"""Resolution rules: from SLURM / torchrun / user variables to torch.distributed's.

One pure function, :func:`resolve`, reads an environment mapping and returns the
variables torch.distributed needs (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE,
NODE_RANK, MASTER_ADDR, MASTER_PORT), the layout, the GPU index and thread count for
this process, and warnings. It never touches ``os.environ``; callers apply the result.

Precedence, per variable:
1. a value torchrun or the user already set wins and is never overwritten (a warning
   names any SLURM value that disagrees);
2. otherwise SLURM's step variables (``SLURM_STEP_*``), then the job's;
3. otherwise the single-process defaults.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Mapping

from workload.launch.errors import LaunchError
from workload.launch.nodes import first_node, tasks_per_node

KEYS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "NODE_RANK",
        "MASTER_ADDR", "MASTER_PORT")
SINGLE, PER_TASK, TORCHRUN = "single", "per-task", "torchrun-per-node"

# MASTER_PORT = PORT_BASE + 10 * (job id mod 1000) + step slot: below Linux's ephemeral
# range (32768+), distinct for up to 10 concurrent steps of one job and for jobs whose
# ids differ by less than 1000. The batch script itself (no step) uses slot 9.
PORT_BASE, PORT_LAST = 20000, 29999
BATCH_STEP_SLOT = 9
DEFAULT_PORT = 29500  # torch's own default, used outside SLURM
# Values are exported into shells and processes: host names, IPs and numbers only.
SAFE_VALUE = re.compile(r"^[A-Za-z0-9._:-]+$")


@dataclass(frozen=True)
class Resolution:
    """What one process should run with."""

    layout: str
    values: dict[str, str]        # variables to export (user/torchrun values included)
    gpu_index: int | None         # CUDA device for this process; None without GPUs
    threads: int | None           # OMP/torch threads; None = leave the default alone
    warnings: tuple[str, ...] = ()
    notes: dict[str, str] = field(default_factory=dict)  # facts for `check` and logs


# ------------------------------------------------------------------ small readers
def _int(env: Mapping[str, str], name: str, minimum: int = 0) -> int | None:
    raw = env.get(name)
    if raw is None or raw == "":
        return None
    if not re.fullmatch(r"\d+", raw.strip()) or int(raw) < minimum:
        raise LaunchError(name, raw, f"a whole number >= {minimum}",
                          f"unset {name} or set it to a whole number")
    return int(raw)


def _first_int(env: Mapping[str, str], *names: str, minimum: int = 0) -> int | None:
    for name in names:
        value = _int(env, name, minimum)
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


# ------------------------------------------------------------------ SLURM values
def slurm_master_addr(env: Mapping[str, str]) -> str | None:
    """First host of the step's node list, else of the job's (het group 0 first)."""
    for name in ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST_HET_GROUP_0",
                 "SLURM_JOB_NODELIST", "SLURM_NODELIST"):
        if env.get(name):
            return first_node(name, env[name])
    return None


def slurm_port(env: Mapping[str, str]) -> int | None:
    job = _first_int(env, "SLURM_JOB_ID", "SLURM_JOBID")
    if job is None:
        return None
    step = _first_int(env, "SLURM_STEP_ID", "SLURM_STEPID") if in_step(env) else None
    slot = BATCH_STEP_SLOT if step is None else step % 10
    return PORT_BASE + 10 * (job % 1000) + slot


def slurm_world(env: Mapping[str, str]) -> dict[str, int | None]:
    """Rank layout from SLURM: step variables first, then the job's."""
    if not in_step(env):
        # The batch script or an salloc shell: one process, whatever the job's task count.
        return dict(RANK=0, LOCAL_RANK=0, WORLD_SIZE=1, LOCAL_WORLD_SIZE=1, NODE_RANK=0,
                    NUM_NODES=1)
    node_rank = _int(env, "SLURM_NODEID")
    return dict(
        RANK=_int(env, "SLURM_PROCID"),
        LOCAL_RANK=_int(env, "SLURM_LOCALID"),
        WORLD_SIZE=_first_int(env, "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_NPROCS",
                              minimum=1),
        LOCAL_WORLD_SIZE=_tasks_on_node(env, node_rank or 0),
        NODE_RANK=node_rank,
        NUM_NODES=_first_int(env, "SLURM_STEP_NUM_NODES", "SLURM_NNODES", minimum=1),
    )


def _tasks_on_node(env: Mapping[str, str], node_rank: int) -> int | None:
    for name in ("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"):
        if env.get(name):
            counts = tasks_per_node(name, env[name])
            return counts[node_rank] if node_rank < len(counts) else None
    return _int(env, "SLURM_NTASKS_PER_NODE", minimum=1)


# ------------------------------------------------------------------ the rules
def _pick(env: Mapping[str, str], key: str, slurm_value, slurm_name: str,
          default, warnings: list[str]) -> str:
    """The user's/torchrun's value if set (warn on disagreement), else SLURM's."""
    own = env.get(key)
    if own not in (None, ""):
        if slurm_value is not None and str(slurm_value) != own:
            warnings.append(f"{key}={own} is already set and kept, but SLURM says "
                            f"{slurm_name}={slurm_value}; unset {key} to use SLURM's value")
        return own
    return str(default if slurm_value is None else slurm_value)


def _rank_values(env: Mapping[str, str], warnings: list[str]) -> dict[str, str]:
    slurm = slurm_world(env) if in_slurm(env) else {}
    torchrun = under_torchrun(env)
    # Under torchrun the SLURM task ids describe the node, not the worker: no warnings.
    sources = {"RANK": "SLURM_PROCID", "LOCAL_RANK": "SLURM_LOCALID",
               "WORLD_SIZE": "SLURM_STEP_NUM_TASKS",
               "LOCAL_WORLD_SIZE": "SLURM_STEP_TASKS_PER_NODE", "NODE_RANK": "SLURM_NODEID"}
    values = {}
    for key, slurm_name in sources.items():
        slurm_value = None if torchrun and key != "NODE_RANK" else slurm.get(key)
        default = 1 if key.endswith("WORLD_SIZE") else 0
        if key == "NODE_RANK" and torchrun and env.get("GROUP_RANK"):
            slurm_value, slurm_name = env["GROUP_RANK"], "GROUP_RANK (torchrun)"
        values[key] = _pick(env, key, slurm_value, slurm_name, default, warnings)
    return values


def _rendezvous_values(env: Mapping[str, str], warnings: list[str]) -> dict[str, str]:
    slurm = in_slurm(env)
    addr = slurm_master_addr(env) if slurm else None
    port = slurm_port(env) if slurm else None
    return {
        "MASTER_ADDR": _pick(env, "MASTER_ADDR", addr, "the first node", "127.0.0.1", warnings),
        "MASTER_PORT": _pick(env, "MASTER_PORT", port, "the job-derived port",
                             DEFAULT_PORT, warnings),
    }


def _validate(values: Mapping[str, str]) -> None:
    for key, value in values.items():
        if not SAFE_VALUE.fullmatch(value):
            raise LaunchError(key, value, "a host name, address or number without shell "
                              "metacharacters", f"unset {key} or fix its value")
    numbers = {key: _int(values, key, minimum=1 if key.endswith("WORLD_SIZE") else 0)
               for key in KEYS if key in values and key != "MASTER_ADDR"}
    for rank, size in (("RANK", "WORLD_SIZE"), ("LOCAL_RANK", "LOCAL_WORLD_SIZE")):
        if rank in numbers and size in numbers and numbers[rank] >= numbers[size]:
            raise LaunchError(rank, values[rank], f"a rank below {size}={values[size]}",
                              f"check the srun task count or unset {rank} and {size}")
    port = numbers.get("MASTER_PORT")
    if port is not None and not 1024 <= port <= 65535:
        raise LaunchError("MASTER_PORT", values["MASTER_PORT"], "a port in 1024-65535",
                          "unset MASTER_PORT to use the job-derived port")


def gpu_index(visible_gpus: int, local_rank: int) -> int | None:
    """Device 0 when each task sees exactly one GPU, else the local rank."""
    if visible_gpus <= 0:
        return None
    return 0 if visible_gpus == 1 else local_rank


def thread_count(env: Mapping[str, str], sharing: int) -> int | None:
    """Threads per process from SLURM_CPUS_PER_TASK, unless the user chose."""
    user = env.get("OMP_NUM_THREADS")
    # torchrun sets OMP_NUM_THREADS=1 for its workers when it was unset: not a choice.
    torchrun_default = under_torchrun(env) and user == "1" and sharing > 1
    if user and not torchrun_default:
        return _int(env, "OMP_NUM_THREADS", minimum=1)
    cpus = _int(env, "SLURM_CPUS_PER_TASK", minimum=1)
    return None if cpus is None else max(1, cpus // max(1, sharing))


def _layout(env: Mapping[str, str], world_size: int) -> str:
    if under_torchrun(env):
        return TORCHRUN
    if in_step(env) or world_size > 1:
        return PER_TASK
    return SINGLE


def resolve(env: Mapping[str, str], visible_gpus: int = 0) -> Resolution:
    """Resolve the launch variables of the process that will train (the worker)."""
    warnings: list[str] = []
    values = _rank_values(env, warnings) | _rendezvous_values(env, warnings)
    _validate(values)
    layout = _layout(env, int(values["WORLD_SIZE"]))
    local_rank = int(values["LOCAL_RANK"])
    sharing = int(values["LOCAL_WORLD_SIZE"]) if layout == TORCHRUN else 1
    threads = thread_count(env, sharing)
    if threads is not None:
        values["OMP_NUM_THREADS"] = str(threads)
    notes = _notes(env, values, visible_gpus)
    return Resolution(layout, values, gpu_index(visible_gpus, local_rank), threads,
                      tuple(warnings), notes)


def resolve_for_torchrun(env: Mapping[str, str]) -> Resolution:
    """Variables for a torchrun about to start on this node (one task per node).

    torchrun assigns RANK/LOCAL_RANK/WORLD_SIZE to its workers itself; what it needs
    from us is the node's rank, the node count and the rendezvous address. torchrun reads
    its flag defaults from PET_<FLAG> variables, so exporting PET_NNODES, PET_NODE_RANK,
    PET_MASTER_ADDR and PET_MASTER_PORT makes a bare ``torchrun --nproc-per-node=4``
    join the other nodes; flags given on its command line still win.
    """
    warnings: list[str] = []
    values: dict[str, str] = {}
    if in_slurm(env):
        slurm = slurm_world(env)
        values["NODE_RANK"] = _pick(env, "NODE_RANK", slurm["NODE_RANK"], "SLURM_NODEID",
                                    0, warnings)
        values |= _rendezvous_values(env, warnings)
        pet = {"PET_NNODES": str(slurm["NUM_NODES"] or 1), "PET_NODE_RANK": values["NODE_RANK"],
               "PET_MASTER_ADDR": values["MASTER_ADDR"], "PET_MASTER_PORT": values["MASTER_PORT"]}
        values |= {key: env.get(key) or value for key, value in pet.items()}
    _validate(values)
    notes = _notes(env, values, 0)
    return Resolution(TORCHRUN, values, None, None, tuple(warnings), notes)


def _notes(env: Mapping[str, str], values: Mapping[str, str], visible_gpus: int) -> dict[str, str]:
    """Facts `check` compares: SLURM's view of this step and job."""
    notes = {"visible_gpus": str(visible_gpus)}
    if in_slurm(env):
        slurm = slurm_world(env)
        notes["in_step"] = str(in_step(env))
        notes["slurm_tasks_on_node"] = str(slurm["LOCAL_WORLD_SIZE"] or 1)
        notes["job_tasks"] = str(_first_int(env, "SLURM_NTASKS", "SLURM_NPROCS", minimum=1) or 1)
        if slurm["WORLD_SIZE"] is not None:
            notes["step_tasks"] = str(slurm["WORLD_SIZE"])
        procid = _int(env, "SLURM_PROCID")
        if procid is not None:
            notes["slurm_procid"] = str(procid)
    return notes
