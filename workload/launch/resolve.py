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

from workload.launch.cpus import process_cpus, thread_count, usable_cpus
from workload.launch.errors import LaunchError
from workload.launch.gpus import GPU_VARIABLE, gpu_index, local_rank_warning
from workload.launch.nodes import first_node, tasks_per_node
from workload.launch.variables import (first_whole_number, in_slurm, in_step, under_torchrun,
                                       whole_number)

KEYS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "NODE_RANK",
        "MASTER_ADDR", "MASTER_PORT")
SINGLE, PER_TASK, TORCHRUN = "single", "per-task", "torchrun-per-node"

# MASTER_PORT = PORT_BASE + 10 * (job id mod 1000) + step slot: below Linux's ephemeral
# range (32768+), distinct for up to 10 concurrent steps of one job and for jobs whose
# ids differ by less than 1000. The batch script itself (no step) uses slot 9.
PORT_BASE, PORT_LAST = 20000, 29999
BATCH_STEP_SLOT = 9
DEFAULT_PORT = 29500  # torch's own default, used outside SLURM
# Warning text `check` turns into a problem: the rendezvous address was guessed.
NO_ADDRESS = "no rendezvous address"
# Values are exported into shells and processes: host names, IPs and numbers only.
SAFE_VALUE = re.compile(r"^[A-Za-z0-9._:-]+$")
# torchrun's --rdzv-conf: key=value pairs separated by commas (no shell metacharacters).
SAFE_CONF = re.compile(r"^[A-Za-z0-9._:=,-]+$")


@dataclass(frozen=True)
class Resolution:
    """What one process should run with."""

    layout: str
    values: dict[str, str]        # variables to export (user/torchrun values included)
    gpu_index: int | None         # CUDA device for this process; None without GPUs
    threads: int | None           # OMP/torch threads; None = leave the default alone
    cpus: int | None = None       # CPUs this process owns (threads, data workers); None:
                                  # not a worker (a torchrun about to start)
    warnings: tuple[str, ...] = ()
    notes: dict[str, str] = field(default_factory=dict)  # facts for `check` and logs


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


def _rendezvous_values(env: Mapping[str, str], warnings: list[str],
                       nodes: int = 1) -> dict[str, str]:
    """MASTER_ADDR/MASTER_PORT; `nodes` > 1 when the ranks are known to span several hosts."""
    slurm = in_slurm(env)
    addr = slurm_master_addr(env) if slurm else None
    port = slurm_port(env) if slurm else None
    if addr is None and not env.get("MASTER_ADDR") and nodes > 1:
        warnings.append(f"{NO_ADDRESS}: the ranks span {nodes} nodes but neither MASTER_ADDR "
                        f"nor a SLURM node list says where rank 0 runs, so the rendezvous "
                        f"address defaults to 127.0.0.1 and ranks on other nodes cannot "
                        f"join; set MASTER_ADDR to rank 0's host name or address")
    return {
        "MASTER_ADDR": _pick(env, "MASTER_ADDR", addr, "the first node", "127.0.0.1", warnings),
        "MASTER_PORT": _pick(env, "MASTER_PORT", port, "the job-derived port",
                             DEFAULT_PORT, warnings),
    }


def _validate(values: Mapping[str, str]) -> None:
    for key, value in values.items():
        if not (SAFE_CONF if key == "PET_RDZV_CONF" else SAFE_VALUE).fullmatch(value):
            raise LaunchError(key, value, "a host name, address or number without shell "
                              "metacharacters", f"unset {key} or fix its value")
    numbers = {key: whole_number(values, key, minimum=1 if key.endswith("WORLD_SIZE") else 0)
               for key in KEYS if key in values and key != "MASTER_ADDR"}
    for rank, size in (("RANK", "WORLD_SIZE"), ("LOCAL_RANK", "LOCAL_WORLD_SIZE")):
        if rank in numbers and size in numbers and numbers[rank] >= numbers[size]:
            raise LaunchError(rank, values[rank], f"a rank below {size}={values[size]}",
                              f"check the srun task count or unset {rank} and {size}")
    port = numbers.get("MASTER_PORT")
    if port is not None and not 1024 <= port <= 65535:
        raise LaunchError("MASTER_PORT", values["MASTER_PORT"], "a port in 1024-65535",
                          "unset MASTER_PORT to use the job-derived port")


def _layout(env: Mapping[str, str], world_size: int) -> str:
    if under_torchrun(env):
        return TORCHRUN
    if in_step(env) or world_size > 1:
        return PER_TASK
    return SINGLE


def _nodes_spanned(values: Mapping[str, str]) -> int:
    """How many hosts the ranks need at least (1 when the numbers are not usable)."""
    try:
        world, local = int(values["WORLD_SIZE"]), int(values["LOCAL_WORLD_SIZE"])
    except ValueError:
        return 1  # _validate names the bad value
    return -(-world // max(1, local))


def resolve(env: Mapping[str, str], visible_gpus: int = 0,
            cpus: int | None = None) -> Resolution:
    """Resolve the launch variables of the process that will train (the worker).

    `cpus`: the CPUs this process may use (default: its affinity mask).
    """
    warnings: list[str] = []
    values = _rank_values(env, warnings)
    values |= _rendezvous_values(env, warnings, _nodes_spanned(values))
    _validate(values)
    layout = _layout(env, int(values["WORLD_SIZE"]))
    local_rank = int(values["LOCAL_RANK"])
    local_processes = int(values["LOCAL_WORLD_SIZE"])
    owned = process_cpus(env, local_processes, usable_cpus() if cpus is None else cpus,
                         warnings)
    threads = thread_count(env, owned, local_processes)
    if threads is not None:
        values["OMP_NUM_THREADS"] = str(threads)
    notes = _notes(env, values, visible_gpus)
    gpu = _gpu(env, visible_gpus, local_rank, warnings, notes)
    if gpu is not None:
        values[GPU_VARIABLE] = str(gpu)
    return Resolution(layout, values, gpu, threads, owned, tuple(warnings), notes)


def _gpu(env: Mapping[str, str], visible: int, local_rank: int, warnings: list[str],
         notes: dict[str, str]) -> int | None:
    """This process's GPU index (the user's LOCAL_GPU wins), and the LOCAL_RANK pitfall.

    One visible GPU and LOCAL_RANK > 0 is the normal --gpus-per-task=1 layout: only a
    note (the entrypoint shows it to other programs, `check` prints it). Several visible
    GPUs that LOCAL_RANK cannot index is a real oddity: a warning everyone sees.
    """
    own = whole_number(env, GPU_VARIABLE)
    if own is not None and visible and own >= visible:
        raise LaunchError(GPU_VARIABLE, str(own), f"a GPU index below the {visible} visible",
                          f"unset {GPU_VARIABLE} or pick 0-{visible - 1}")
    pitfall = local_rank_warning(visible, local_rank)
    if pitfall and own is None:
        notes["local_rank_pitfall"] = pitfall
        if visible > 1:
            warnings.append(pitfall)
    return own if own is not None else gpu_index(visible, local_rank)


def _notes(env: Mapping[str, str], values: Mapping[str, str], visible_gpus: int) -> dict[str, str]:
    """Facts `check` compares: SLURM's view of this step and job."""
    notes = {"visible_gpus": str(visible_gpus)}
    if in_slurm(env):
        slurm = slurm_world(env)
        notes["in_step"] = str(in_step(env))
        notes["slurm_tasks_on_node"] = str(slurm["LOCAL_WORLD_SIZE"] or 1)
        notes["job_tasks"] = str(first_whole_number(env, "SLURM_NTASKS", "SLURM_NPROCS",
                                                    minimum=1) or 1)
        if slurm["WORLD_SIZE"] is not None:
            notes["step_tasks"] = str(slurm["WORLD_SIZE"])
        procid = whole_number(env, "SLURM_PROCID")
        if procid is not None:
            notes["slurm_procid"] = str(procid)
    return notes
