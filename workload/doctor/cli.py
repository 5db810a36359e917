"""`doctor`: check a node, a container and a whole allocation before a long training job.

One process (a login node, an interactive GPU node, a container on a laptop):
    doctor
    apptainer exec --nv image.sif doctor --output-dir $SCRATCH/runs

Every rank of a job, exactly as train will be started (one task per GPU):
    srun -N2 --ntasks-per-node=4 --gpus-per-task=1 apptainer exec --nv image.sif doctor

One task per node running torchrun (the Olivia guide's layout):
    srun -N2 --ntasks-per-node=1 apptainer exec --nv image.sif \\
        torchrun --nproc-per-node=4 --nnodes=2 --rdzv-backend=c10d \\
        --rdzv-endpoint=$MASTER_ADDR:29500 -m workload.doctor

CPU smoke run with two processes (gloo):
    torchrun --nproc-per-node=2 -m workload.doctor --device cpu

Rank 0 prints the rank map, the all-reduce bandwidth and every finding; `--json PATH`
writes the same. Exit status 1 when a check failed (each failure names its fix), 2 on bad
flags, 0 otherwise (warnings included).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

import torch

from workload import distributed
from workload.doctor import driver, fabric, local, ranks
from workload.doctor.findings import FAIL, INFO, OK, WARN, Finding, worst
from workload.doctor.output import print_report, write_json_report
from workload.errors import UsageError, exit_with_usage_error

EXIT_FAILED = 1


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="doctor", description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n".join(__doc__.split("\n")[2:]))
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                   help="as train's --device (default auto: the GPU when one is visible)")
    p.add_argument("--output-dir", default="runs",
                   help="the folder train will write to; checked for writing (default runs)")
    p.add_argument("--json", metavar="PATH", help="also write the findings as JSON (rank 0)")
    p.add_argument("--probe-mib", type=float, default=64.0,
                   help="all-reduce probe size in MiB (default 64; 0 = no probe)")
    p.add_argument("--probe-iters", type=int, default=5, help="timed all-reduces (default 5)")
    p.add_argument("--timeout", type=float, default=120.0,
                   help="seconds to wait for all ranks to join (default 120)")
    p.add_argument("--shm-path", default="/dev/shm",
                   help="the shared-memory mount to check (default /dev/shm)")
    return p


def check_flags(args) -> None:
    """Bad flags: one line and exit status 2 before any process group forms."""
    if args.probe_mib < 0:
        raise UsageError(f"--probe-mib must be 0 (no probe) or more, got {args.probe_mib}")
    if args.probe_iters < 1:
        raise UsageError(f"--probe-iters must be 1 or more, got {args.probe_iters}")
    if args.timeout <= 0:
        raise UsageError(f"--timeout must be more than 0 seconds, got {args.timeout}; "
                         "pass e.g. --timeout 120")
    if args.json and local.writable(str(Path(args.json).parent)):
        raise UsageError(f"--json {args.json}: cannot write into "
                         f"{Path(args.json).parent}; pass a path in a folder you can write to")


def local_findings(args, info) -> list[Finding]:
    """This process's own checks (every rank runs them: nodes and containers differ)."""
    found = [local.gpu_visibility(args.device), driver.driver_check()]
    every_gpu = info.world_size == 1
    found += [local.matmul_check(d) for d in local.devices_to_check(info.device, every_gpu)]
    found += [local.shm_check(args.shm_path), local.dali_check(), local.tf32_check(),
              local.threads_check(info.local_world_size), local.output_dir_check(args.output_dir)]
    return found + local.cache_checks()


def join(args):
    """The launch layer's process group (gloo on the CPU, NCCL on GPUs), or a fatal finding."""
    try:
        return distributed.init_distributed(args.device, args.timeout), None
    except UsageError:
        raise
    except Exception as error:  # a rendezvous timeout or refused connection, not bad input
        return None, Finding("process-group", FAIL, f"could not join the process group: "
                             f"{error}".splitlines()[0],
                             "check MASTER_ADDR/MASTER_PORT (python -m workload.launch env), "
                             "that every rank started (srun --kill-on-bad-exit=1), and "
                             "that the nodes reach each other on MASTER_PORT")


def probe(args, info) -> tuple[dict | None, Finding]:
    if info.backend is None:
        return None, Finding("allreduce", INFO, "one process: no all-reduce to measure")
    if args.probe_mib == 0:
        return None, Finding("allreduce", INFO, "probe skipped (--probe-mib 0)")
    try:
        result = ranks.allreduce_probe(info, args.probe_mib, args.probe_iters)
        correct = ranks.allreduce_is_correct(info)
    except Exception as error:
        return None, Finding("allreduce", FAIL, f"all-reduce failed: {error}".splitlines()[0],
                             "rerun with NCCL_DEBUG=INFO and read the first rank's error")
    if not correct:
        return result, Finding("allreduce", FAIL, "all-reduce returned a wrong sum",
                               "a faulty rank or network: exclude nodes one by one")
    return result, Finding("allreduce", OK, f"{result['bytes'] / 2**20:.0f} MiB on "
                           f"{info.world_size} ranks ({info.backend}): "
                           f"{result['time_s'] * 1e3:.2f} ms, busbw "
                           f"{result['busbw_gbps']:.2f} GB/s")


def diagnose(args) -> dict:
    """Every check on this rank; the all-rank results gathered on every rank."""
    if args.device == "cuda" and not torch.cuda.is_available():
        return failed(local.gpu_visibility(args.device))
    with tempfile.TemporaryDirectory(prefix="doctor-") as folder:
        return diagnose_ranks(args, fabric.capture_nccl_log(Path(folder)))


def diagnose_ranks(args, nccl_log: Path | None) -> dict:
    info, failure = join(args)
    if info is None:
        return failed(failure)
    try:
        mine = local_findings(args, info)
        result, bandwidth = probe(args, info)
        everyone = ranks.gather(dict(place=ranks.my_place(info), versions=local.versions(),
                                     findings=mine), info)
    finally:
        distributed.teardown()
    rank_map = [r["place"] for r in everyone]
    # This rank's NCCL log speaks for the job: rank 0 is the one that prints.
    transport = fabric.transport_finding(info.backend, fabric.read_nccl_log(nccl_log),
                                         fabric.fabric_devices(),
                                         len({place["node"] for place in rank_map}))
    return dict(world_size=info.world_size, backend=info.backend, is_main=info.is_main,
                ranks=rank_map, allreduce=result, versions=[r["versions"] for r in everyone],
                findings=[(r["place"]["rank"], f) for r in everyone for f in r["findings"]]
                + consistency(everyone) + [(0, bandwidth), (0, transport)])


def failed(finding: Finding) -> dict:
    """The outcome when the job cannot even start: one fatal finding, nothing gathered."""
    return dict(world_size=None, ranks=[], findings=[(0, finding)], allreduce=None)


def consistency(everyone: list[dict]) -> list[tuple[int, Finding]]:
    """Checks that need every rank: one GPU per rank, the same versions everywhere."""
    found = []
    places = [r["place"] for r in everyone]
    if shared := ranks.shared_devices(places):
        found.append((0, Finding("rank-map", FAIL, "ranks share a GPU: " + "; ".join(shared),
                                 "one task per GPU: srun --gpus-per-task=1, or "
                                 "--ntasks-per-node equal to the GPUs per node")))
    if crowded := ranks.crowded_nodes(places):
        found.append((0, Finding("threads", WARN, "ranks oversubscribe their CPUs: "
                                 + "; ".join(crowded), "srun --cpus-per-task=N (train then "
                                 "divides them among its ranks), or lower OMP_NUM_THREADS")))
    differing = {k for r in everyone for k, v in r["versions"].items()
                 if v != everyone[0]["versions"].get(k)}
    if differing:
        found.append((0, Finding("versions", WARN, "ranks run different versions of "
                                 + ", ".join(sorted(differing)),
                                 "start every rank from the same image")))
    return found


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    try:
        check_flags(args)
        outcome = diagnose(args)
    except UsageError as error:
        exit_with_usage_error("doctor", error)
    findings = [f for _, f in outcome["findings"]]
    if outcome.get("is_main", True):
        print_report(outcome, sys.stdout)
        if args.json:
            write_json_report(Path(args.json), outcome)
    sys.exit(EXIT_FAILED if worst(findings) == FAIL else 0)
