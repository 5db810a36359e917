"""Ranks started by hand on this host, as a user would start them (the torch.distributed
variables, no torchrun agent: one torch process fewer per run than under torchrun)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.helpers import free_ports, local_rank_env
from tests.helpers.hangs import descendants, thread_states


def rank_envs(world: int) -> list[dict[str, str]]:
    """Each rank's environment, the rendezvous on one free port."""
    port = free_ports(1)[0]
    return [local_rank_env(rank, world, port) for rank in range(world)]


def start_ranks(command: list[str], world: int = 2) -> list[subprocess.Popen]:
    """`world` ranks of `command`, each printing to a pipe of its own."""
    return [subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True, env=env) for env in rank_envs(world)]


def start_logged_ranks(command: list[str], logs: Path, world: int = 2) -> list[subprocess.Popen]:
    """`world` ranks of `command` working in `logs`, each printing to logs/rank-N.log: a
    test can read a file while the ranks run (a pipe nobody reads fills and blocks them)."""
    logs.mkdir(parents=True, exist_ok=True)
    procs = []
    for rank, env in enumerate(rank_envs(world)):
        with open(logs / f"rank-{rank}.log", "w") as log:
            procs.append(subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                          env=env, cwd=logs))
    return procs


def finish_ranks(procs: list[subprocess.Popen], timeout: float = 300) -> list[str]:
    """Every rank's output; a rank still running after `timeout` seconds is killed, and
    the failure shows where each process of each rank was then and what it printed."""
    try:
        return [p.communicate(timeout=timeout)[0] for p in procs]
    except subprocess.TimeoutExpired:
        where = "\n".join(thread_states(pid) for pid in descendants(*(p.pid for p in procs)))
        for p in procs:
            p.kill()
        logs = [p.communicate()[0] for p in procs]
        raise AssertionError(f"a rank did not end; its processes then:\n{where}\n" + "\n".join(
            f"--- rank {rank}\n{log[-3000:]}" for rank, log in enumerate(logs))) from None
