"""What `doctor` checks on each rank and across the job (see workload/doctor/__init__.py):
local findings, joining the process group, the all-reduce probe, consistency of ranks."""

from __future__ import annotations

from pathlib import Path

import torch

from workload import distributed
from workload.doctor import driver, local, mpi, nvml, pairs, ranks, storage, sweep
from workload.doctor.findings import FAIL, INFO, OK, WARN, Finding
from workload.errors import UsageError
from workload.launch import PreemptionFlag, nccl_net


def local_findings(args, info) -> list[Finding]:
    """This process's own checks (every rank runs them: nodes and containers differ)."""
    found = [local.gpu_visibility(args.device), driver.driver_check()]
    every_gpu = info.world_size == 1
    found += [local.matmul_check(d) for d in local.devices_to_check(info.device, every_gpu)]
    need = local.loader_need(args.batch_size, args.image_size, info.local_world_size)
    found += [local.shm_check(args.shm_path, need), local.dali_check(), local.tf32_check(),
              local.nccl_check(),
              local.threads_check(info.local_world_size), local.output_dir_check(args.output_dir)]
    plugin = mpi.mpi_check()
    return found + local.cache_checks() + storage.storage_checks() + ([plugin] if plugin else [])


def join(args, flag: PreemptionFlag):
    """The launch layer's process group (gloo on the CPU, NCCL on GPUs), or a fatal finding;
    `flag`: doctor's, acted on for a signal while the ranks meet."""
    try:
        return distributed.init_distributed(args.device, args.timeout, flag), None
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
    buffer = ranks.probe_buffer(info, args.probe_mib)
    if buffer is None:  # a size beyond memory, not the network's fault
        return None, Finding("allreduce", FAIL, f"--probe-mib {args.probe_mib:g} does not fit "
                             f"in the free memory of every rank's {info.device.type} "
                             "(probe not run)", "pass a smaller --probe-mib (default 64)")
    try:
        result = ranks.allreduce_probe(info, buffer, args.probe_iters)
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


def run_checks(args, flag: PreemptionFlag) -> dict:
    """Every check on this rank; the all-rank results gathered on every rank."""
    if args.device == "cuda" and not torch.cuda.is_available():
        return failed(local.gpu_visibility(args.device))
    with nccl_net.nccl_log_for_one_run() as nccl_log:
        return check_ranks(args, nccl_log, flag)


def check_ranks(args, nccl_log: Path | None, flag: PreemptionFlag) -> dict:
    info, failure = join(args, flag)
    if info is None:
        return failed(failure)
    try:
        mine = local_findings(args, info)
        result, bandwidth = probe(args, info)
        everyone = ranks.gather(dict(place=ranks.my_place(info), versions=local.versions(),
                                     findings=mine, nvml=nvml.read_gpu(info.device),
                                     **swept(args, info)), info)
    finally:
        distributed.teardown()
    rank_map = [r["place"] for r in everyone]
    readings = [r["nvml"] for r in everyone]
    gpus = nvml.nvml_findings_by_rank(readings, [p["node"] for p in rank_map])
    # This rank's NCCL log speaks for the job: rank 0 is the one that prints.
    transport = ranks.transport_finding(info.backend, nccl_net.read_nccl_log(nccl_log),
                                        nccl_net.fabric_devices(),
                                        len({place["node"] for place in rank_map}))
    return dict(world_size=info.world_size, backend=info.backend, is_main=info.is_main,
                ranks=rank_map, allreduce=result, versions=[r["versions"] for r in everyone],
                gpus=readings,
                findings=[(r["place"]["rank"], f) for r in everyone for f in r["findings"]]
                + consistency(everyone) + [(0, bandwidth), (0, transport)]
                + sweep_findings(everyone, args) + gpus)


def swept(args, info) -> dict:
    """This rank's all-reduce sweeps (all ranks together, then every pair: with 3 ranks
    or more, where a pair is not the whole job) and matmul rate."""
    sync = lambda: ranks._sync(info.device)  # noqa: E731
    sizes = sweep.sweep_sizes(args.sweep_max_mib) if info.backend else []
    found = dict(sweep=sweep.allreduce_sweep(torch.distributed.all_reduce, info.rank,
                                             info.world_size, sizes, info.device, sync),
                 matmul_gflops=sweep.matmul_rate(info.device, sync))
    if paired := pair_sizes(args, info.world_size):
        found.update(pairs.timed_pair_sweep(pairs.PairComm(), info.rank,
                                            info.world_size, paired, args.pair_rounds,
                                            info.device, sync))
    return found


def pair_sizes(args, world_size: int) -> list[int]:
    """The pair sweep's sizes: none with 2 ranks, where the one pair is the whole job."""
    return sweep.sweep_sizes(args.pair_max_mib) if world_size > 2 else []


def sweep_findings(everyone: list[dict], args) -> list[tuple[int, Finding]]:
    hosts = [r["place"]["node"] for r in everyone]
    found = [(0, sweep.matmul_finding([r["matmul_gflops"] for r in everyone], hosts))]
    if any(r["sweep"] for r in everyone):
        found.append((0, sweep.sweep_finding([r["sweep"] for r in everyone], hosts)))
    if paired := pair_sizes(args, len(everyone)):
        seconds = max(r["pair_seconds"] for r in everyone)
        found += [(0, f) for f in pairs.pair_findings(
            [r["pairs"] for r in everyone], hosts, paired, args.pair_rounds, seconds)]
    return found


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
