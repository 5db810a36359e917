"""SLURM node lists and task counts, expanded with python-hostlist (never scontrol).

scontrol is usually missing inside containers, so the launch layer parses SLURM's
compressed notation itself: ``nid[001-004]``, ``gpu[01-02]-ib[0-1]``, ``a1,b[2-3]``,
and task counts such as ``2(x3),1``.
"""

from __future__ import annotations

import hostlist

from workload.launch.errors import LaunchError


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
