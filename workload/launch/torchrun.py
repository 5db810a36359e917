"""torchrun once per node: the variables its agent needs (node rank, node count, rendezvous).

The workers torchrun starts resolve their own ranks with :func:`workload.launch.resolve`.
"""

from __future__ import annotations

from typing import Mapping

from workload.launch.resolve import (TORCHRUN, Resolution, _notes, _pick, _rendezvous_values,
                                     _validate, slurm_world)
from workload.launch.variables import first_whole_number, in_slurm, in_step

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
    notes = _notes(env, values, 0)
    return Resolution(TORCHRUN, values, None, None, warnings=tuple(warnings),
                      notes=notes)


def _rendezvous_id(env: Mapping[str, str]) -> str:
    """One id per job step, the same on every node: ``slurm-<job>-<step>``."""
    job = first_whole_number(env, "SLURM_JOB_ID", "SLURM_JOBID")
    step = first_whole_number(env, "SLURM_STEP_ID", "SLURM_STEPID") if in_step(env) else None
    return f"slurm-{job}-{'batch' if step is None else step}"
