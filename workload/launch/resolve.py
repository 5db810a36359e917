"""Resolution rules: from SLURM / torchrun / user variables to torch.distributed's.

One pure function, :func:`resolve`, reads an environment mapping and returns the
variables torch.distributed needs (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE,
NODE_RANK, MASTER_ADDR, MASTER_PORT), the layout, the GPU index and thread count for
this process, and warnings. It never touches ``os.environ``; callers apply the result
with :meth:`Resolution.export`, the one export rule (1 below).
A torchrun about to start on a node gets :func:`resolve_for_torchrun` instead: the node's
rank, the node count and the rendezvous (its workers then resolve their own ranks).

Precedence, per variable:
1. a value torchrun or the user already set wins and is never overwritten (a warning
   names any SLURM value that disagrees). A torchrun worker's NODE_RANK is the one
   exception: it is torchrun's GROUP_RANK, which its c10d rendezvous assigns in order of
   arrival, and the NODE_RANK the worker inherited was only torchrun's own (ignored) hint;
2. otherwise SLURM's step variables (``SLURM_STEP_*``), then the job's;
3. otherwise the single-process defaults.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from collections.abc import Mapping, MutableMapping

from workload.errors import LaunchError
from workload.launch.devices import (GPU_VARIABLE, gpu_index, local_rank_warning,
                                     process_cpus, thread_count, usable_cpus)
from workload.launch.variables import (first_whole_number, in_slurm, in_step, slurm_master_addr,
                                       slurm_port, slurm_world, under_torchrun, whole_number)

DIST_KEYS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "NODE_RANK",
        "MASTER_ADDR", "MASTER_PORT")
SINGLE = "single"
PER_TASK = "per-task"
TORCHRUN = "torchrun-per-node"

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
    replaces: frozenset[str] = frozenset({"OMP_NUM_THREADS"})  # see export()

    def export(self, env: MutableMapping[str, str]) -> None:
        """Write the values into `env`, never over one torchrun or the user set (rule 1
        above), except the `replaces` keys. The thread count is one only in name:
        resolve() keeps a user's OMP_NUM_THREADS and replaces only torchrun's placeholder
        1 by the worker's share of the task's CPUs. A torchrun worker's NODE_RANK is the
        other: torchrun's GROUP_RANK replaces the hint the worker inherited."""
        for key, value in self.values.items():
            if not env.get(key) or key in self.replaces:
                env[key] = value


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
        if key == "NODE_RANK" and torchrun and env.get("GROUP_RANK"):
            values[key] = env["GROUP_RANK"]  # rule 1's exception: torchrun's own
            continue
        slurm_value = None if torchrun and key != "NODE_RANK" else slurm.get(key)
        default = 1 if key.endswith("WORLD_SIZE") else 0
        values[key] = _pick(env, key, slurm_value, slurm_name, default, warnings)
    return values


def _rendezvous_values(env: Mapping[str, str], warnings: list[str],
                       nodes: int = 1) -> dict[str, str]:
    """MASTER_ADDR/MASTER_PORT; `nodes` > 1 when the ranks are known to span several hosts.
    A torchrun worker's are torchrun's (`--standalone`: localhost and a free port), never
    compared with SLURM's."""
    slurm = in_slurm(env) and not under_torchrun(env)
    addr = slurm_master_addr(env) if slurm else None
    port = slurm_port(env) if slurm else None
    if addr is None and not env.get("MASTER_ADDR") and nodes > 1:
        warnings.append(f"{NO_ADDRESS}: the ranks span {nodes} nodes but neither MASTER_ADDR "
                        f"nor a SLURM node list says where rank 0 runs, so the rendezvous "
                        f"address defaults to 127.0.0.1 and ranks on other nodes cannot "
                        f"join; set MASTER_ADDR to rank 0's host name or address")
    own = env.get("MASTER_ADDR") or ""
    if addr is not None and own.startswith(addr) and not own[len(addr):][:1].isdigit():
        # The first node by another interface's or the full host name, as centres document
        # it (JSC: "<node>i", the InfiniBand name): the same host, chosen on purpose. A
        # digit after the name would make it another node (nid001 -> nid0010).
        addr = own
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
               for key in DIST_KEYS if key in values and key != "MASTER_ADDR"}
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
        world = int(values["WORLD_SIZE"])
        local = int(values["LOCAL_WORLD_SIZE"])
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
    notes = _notes(env, visible_gpus)
    gpu = _gpu(env, visible_gpus, local_rank, warnings, notes)
    if gpu is not None:
        values[GPU_VARIABLE] = str(gpu)
    replaces = {"OMP_NUM_THREADS"} | ({"NODE_RANK"} if layout == TORCHRUN else set())
    return Resolution(layout, values, gpu, threads, owned, tuple(warnings), notes,
                      frozenset(replaces))


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


def _notes(env: Mapping[str, str], visible_gpus: int) -> dict[str, str]:
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


# ------------------------------------------------------------------ torchrun per node
# Why torchrun gets a c10d rendezvous and a store of its own per restart
# ---------------------------------------------------------------------
# Since torch 2.4 torchrun's agent hosts one TCPStore and hands it to the workers
# (TORCHELASTIC_USE_AGENT_STORE=True; init_process_group's env:// then connects to it as
# a client). The agent creates that store once and keeps it for every restart: the
# static rendezvous (torchrun --master-addr/--master-port) always, the c10d one
# (--standalone, --rdzv-backend=c10d) since its store is only built on the first round.
# A restarted worker group therefore finds the keys of the dead group still in the store:
# gloo reads the old ranks' listening addresses ("Gloo connectFullMesh failed ...
# Connection refused", or a hang), NCCL an old unique id, whenever a peer reads before
# the new rank 0 overwrote them -- about every second restart on one node, for any
# script. torch keys nothing by attempt (TORCHELASTIC_RESTART_COUNT is per node and
# differs between nodes, so it cannot be). Upstream:
#   https://github.com/pytorch/pytorch/issues/135712 (store shared across restarts;
#     TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 is the reported cure)
#   https://github.com/pytorch/pytorch/issues/167288 (still seen with --max-restarts)
# What avoids it: TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 with the c10d rendezvous. Each
# rendezvous round then publishes a fresh port under round-scoped keys and the workers'
# rank 0 starts a new, empty store there; the round is the same on every node (the
# restart counter is not). The static rendezvous ignores the variable, so under SLURM
# torchrun gets the c10d rendezvous at the job-derived address instead: the store on the
# first node (is_host, decided by SLURM's node id rather than by host-name matching).
# Flags on torchrun's command line still win over these PET_* defaults.
NO_SHARED_STORE = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
# What torchrun reads its flag defaults from (see resolve_for_torchrun).
PET_KEYS = ("PET_NNODES", "PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT",
            "PET_RDZV_BACKEND", "PET_RDZV_ENDPOINT", "PET_RDZV_ID", "PET_RDZV_CONF")


def resolve_for_torchrun(env: Mapping[str, str]) -> Resolution:
    """Variables for a torchrun about to start on this node (one task per node).

    torchrun assigns RANK/LOCAL_RANK/WORLD_SIZE to its workers itself; what it needs
    from us is the node's rank, the node count and the rendezvous. torchrun reads its
    flag defaults from PET_<FLAG> variables, so exporting PET_NNODES, PET_NODE_RANK,
    PET_MASTER_ADDR/PORT and PET_RDZV_* makes a bare ``torchrun --nproc-per-node=4``
    join the other nodes; flags given on its command line still win. Elastic restarts
    (--max-restarts) need a fresh store per restart: see the note above.
    """
    warnings: list[str] = []
    values: dict[str, str] = {}
    if in_slurm(env):
        slurm = slurm_world(env)
        nodes = slurm["NUM_NODES"] or 1
        values["NODE_RANK"] = _pick(env, "NODE_RANK", slurm["NODE_RANK"], "SLURM_NODEID",
                                    0, warnings)
        values |= _rendezvous_values(env, warnings, nodes)
        pet = {"PET_NNODES": str(nodes), "PET_NODE_RANK": values["NODE_RANK"],
               "PET_MASTER_ADDR": values["MASTER_ADDR"], "PET_MASTER_PORT": values["MASTER_PORT"],
               "PET_RDZV_BACKEND": "c10d",
               "PET_RDZV_ENDPOINT": f"{values['MASTER_ADDR']}:{values['MASTER_PORT']}",
               "PET_RDZV_ID": _rendezvous_id(env),
               "PET_RDZV_CONF": f"is_host={int(values['NODE_RANK'] == '0')}"}
        values |= {key: env.get(key) or value for key, value in pet.items()}
    values |= {key: env.get(key) or value for key, value in NO_SHARED_STORE.items()}
    _validate(values)
    notes = _notes(env, 0)
    return Resolution(TORCHRUN, values, None, None, warnings=tuple(warnings),
                      notes=notes)


def _rendezvous_id(env: Mapping[str, str]) -> str:
    """One id per job step, the same on every node: ``slurm-<job>-<step>``."""
    job = first_whole_number(env, "SLURM_JOB_ID", "SLURM_JOBID")
    step = first_whole_number(env, "SLURM_STEP_ID", "SLURM_STEPID") if in_step(env) else None
    return f"slurm-{job}-{'batch' if step is None else step}"
