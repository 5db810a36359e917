"""`doctor`: check a node, a container and a whole allocation before a long training job.

One process (a login node, an interactive GPU node, a container on a laptop):
    doctor
    apptainer exec --nv image.sif doctor --output-dir $SCRATCH/runs

Every rank of a job, exactly as train will be started (one task per GPU; CPUs per task
as your site gives them per GPU, 72 on a GH200 node of 4 GPUs and 288 cores):
    srun -N2 --ntasks-per-node=4 --gpus-per-task=1 --cpus-per-task=72 \\
        apptainer exec --nv image.sif doctor

One task per node running torchrun (the Olivia guide's layout). entrypoint.sh, inside the
image on every node, gives torchrun the node count, node rank and rendezvous address of
the job (a $MASTER_ADDR typed here would be expanded by your shell, where it is unset):
    srun -N2 --ntasks-per-node=1 --cpus-per-task=288 apptainer exec --nv image.sif \\
        entrypoint.sh torchrun --nproc-per-node=4 -m workload.doctor

CPU smoke run with two processes (gloo):
    torchrun --nproc-per-node=2 -m workload.doctor --device cpu

Rank 0 prints the rank map, the all-reduce bandwidth and every finding; `--json PATH`
writes the same. Exit status 1 when a check failed (each failure names its fix), 2 on bad
flags, 0 otherwise (warnings included).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from workload.caches import use_private_caches
from workload.commands import command_parser, main_of
from workload.config import add_flags
from workload.errors import UsageError
from workload.files import output_file_problem
from workload.launch.preemption import StartUpFlag

PROG = "doctor"
# Rounds of the pair sweep by default: every pair of up to 65 ranks; beyond, every rank
# still meets 64 partners (a bad NIC or GPU shows in every round), at a bounded cost.
DEFAULT_PAIR_ROUNDS = 64
# The largest all-reduce buffer a size flag may ask for (MiB): far beyond what a bandwidth
# needs, and a bound on the sweeps' doubling sizes.
MAX_MIB = 65536
EXIT_FAILED = 1


def build_parser() -> argparse.ArgumentParser:
    p = command_parser(PROG, __doc__)
    add_flags(p, ("hardware",), only={"device"}, field_defaults=True)
    # train's, to size what its data loaders keep in /dev/shm
    add_flags(p, ("data", "training"), only={"batch_size", "image_size"}, field_defaults=True)
    p.add_argument("--output-dir", default="runs",
                   help="the folder train will write to; checked for writing (default runs)")
    p.add_argument("--json", metavar="PATH", help="also write the findings as JSON (rank 0)")
    p.add_argument("--probe-mib", type=float, default=64.0,
                   help="all-reduce probe size in MiB (default 64; 0 = no probe)")
    p.add_argument("--probe-iters", type=int, default=5, help="timed all-reduces (default 5)")
    p.add_argument("--sweep-max-mib", type=float, default=256.0,
                   help="all-reduce correctness and bandwidth at 1, 2, 4 ... MiB up to this "
                        "(default 256; 0 = no sweep)")
    p.add_argument("--pair-max-mib", type=float, default=64.0,
                   help="the same sweep between every two ranks, in rounds of disjoint "
                        "pairs, at 1, 2, 4 ... MiB up to this (default 64, the sizes where "
                        "faulty links and NCCL's LL128 corrupt; 0 = no pair sweep; runs "
                        "with 3 ranks or more)")
    p.add_argument("--pair-rounds", default=str(DEFAULT_PAIR_ROUNDS),
                   help=f"rounds of pairs to run, each rank meeting one partner per round, "
                        f"or `all` (default {DEFAULT_PAIR_ROUNDS}: every pair up to "
                        f"{DEFAULT_PAIR_ROUNDS + 1} ranks; all pairs of N ranks take N-1 "
                        f"rounds, N for an odd N)")
    p.add_argument("--timeout", type=float, default=120.0,
                   help="seconds to wait for all ranks to join (default 120)")
    p.add_argument("--shm-path", default="/dev/shm",
                   help="the shared-memory mount to check (default /dev/shm)")
    return p


def check_flags(args) -> None:
    """Bad flags: one line and exit status 2 before any process group forms."""
    for flag, off in (("probe-mib", "no probe"), ("sweep-max-mib", "no sweep"),
                      ("pair-max-mib", "no pair sweep")):
        value = getattr(args, flag.replace("-", "_"))
        if not 0 <= value <= MAX_MIB:
            raise UsageError(f"--{flag} must be from 0 ({off}) to {MAX_MIB} (a buffer of "
                             f"{MAX_MIB // 1024} GiB), got {value:g}")
    args.pair_rounds = pair_rounds(args.pair_rounds)
    if args.probe_iters < 1:
        raise UsageError(f"--probe-iters must be 1 or more, got {args.probe_iters}")
    if args.timeout <= 0:
        raise UsageError(f"--timeout must be more than 0 seconds, got {args.timeout}; "
                         "pass e.g. --timeout 120")
    if args.json and (problem := output_file_problem(args.json)):
        raise UsageError(f"--json {args.json} cannot be written ({problem}); pass a file "
                         "path in a folder you can write to")


def pair_rounds(value: str) -> int | None:
    """--pair-rounds: a count of 1 or more, or `all` (None: no bound)."""
    if value == "all":
        return None
    if not value.isdigit() or int(value) < 1:
        raise UsageError(f"--pair-rounds must be a count of 1 or more or `all`, got {value!r}; "
                         "pass --pair-max-mib 0 for no pair sweep")
    return int(value)


def doctor(args, early: StartUpFlag) -> None:
    check_flags(args)
    # The folders it reports are the ones train would use, an unusable one included.
    use_private_caches(PROG, refuse_fatal=False)
    from workload.doctor.checks import run_checks
    from workload.doctor.findings import FAIL, print_report, worst, write_json_report

    outcome = run_checks(args, early)
    findings = [f for _, f in outcome["findings"]]
    if outcome.get("is_main", True):
        print_report(outcome, sys.stdout)
        if args.json:
            write_json_report(Path(args.json), outcome)
    sys.exit(EXIT_FAILED if worst(findings) == FAIL else 0)


main = main_of(PROG, build_parser(), doctor, takes_flag=True)

__all__ = ["main"]
