"""`doctor` on several ranks: two processes under torchrun (gloo on the CPU), and every
rank of a 2-node job on the private SLURM cluster (per-task and torchrun-per-node layouts).

What is asserted is what a user reads before a large job: every rank shows up once in the
rank map with its node and CPU binding, the all-reduce probe ran across all ranks and gave
a positive bus bandwidth computed as nccl-tests define it, and only rank 0 printed.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import clean_env
from tests.helpers import DOCTOR_FAST as FAST
from tests.helpers import by_check
from tests.helpers import REPO

pytestmark = pytest.mark.slow

SRUN = ["srun", "--kill-on-bad-exit=1", "--time=10"]
DOCTOR = [sys.executable, "-m", "workload.doctor"]


def check_job(done, report: Path, ranks: int, nodes: int) -> dict:
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    data = json.loads(report.read_text())
    assert data["world_size"] == ranks and data["backend"] == "gloo"
    rank_map = data["ranks"]
    assert [place["rank"] for place in rank_map] == list(range(ranks))
    assert len({place["node"] for place in rank_map}) == nodes
    assert len({(place["node"], place["pid"]) for place in rank_map}) == ranks
    assert all(place["cpus"] and place["device"] == "cpu" for place in rank_map)
    probe = data["allreduce"]
    assert probe["world_size"] == ranks and probe["bytes"] == 2**20 and probe["time_s"] > 0
    assert probe["busbw_gbps"] > 0
    assert probe["busbw_gbps"] == pytest.approx(probe["algbw_gbps"] * 2 * (ranks - 1) / ranks)
    assert by_check(data, "allreduce")[0]["status"] == "ok"
    # The real sweep on gloo (sizes 1 and 2 MiB in the suite): exact sums on every rank;
    # every rank's matmul rate compared (its verdict is the machine's: CPUs are shared).
    swept = by_check(data, "allreduce-sweep")[0]
    assert swept["status"] == "ok" and "exact sums at 1, 2 MiB" in swept["detail"], swept
    assert by_check(data, "matmul-rate")[0]["status"] in ("ok", "warn")
    # Every pair on its own (with 3 ranks or more: of 2, the one pair is the whole job):
    # 4 ranks on 2 nodes give 3 rounds of 2 pairs, 4 of them across the nodes.
    if ranks > 2:
        paired = by_check(data, "pair-sweep")[0]
        assert paired["status"] == "ok", paired
        assert "exact sums: 6 of 6 pairs in 3 of 3 rounds at 1, 2 MiB" in paired["detail"]
        assert by_check(data, "pair-bandwidth")[0]["status"] in ("ok", "warn")
    else:
        assert not by_check(data, "pair-sweep")
    # CPU ranks: one line for all of them says the NVML checks did not run.
    assert done.stdout.count("NVML checks (clocks, temperature, ECC) did not run") == 1
    # Every rank ran the local checks; rank 0 alone printed the report.
    assert {f["rank"] for f in by_check(data, "matmul")} == set(range(ranks))
    assert done.stdout.count("doctor: ") == 2  # the header and the verdict, once each
    for rank in range(ranks):
        assert any(line.split()[:1] == [str(rank)] for line in done.stdout.splitlines()
                   if line.startswith("  ")), f"rank {rank} missing from the printed table"
    return data


def test_two_processes_under_torchrun(tmp_path):
    report = tmp_path / "doctor.json"
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc-per-node=2", "-m", "workload.doctor", "--device", "cpu",
                           *FAST, "--json", str(report), "--output-dir", str(tmp_path / "runs")],
                          capture_output=True, text=True, timeout=300, env=clean_env(),
                          cwd=tmp_path)
    data = check_job(done, report, ranks=2, nodes=1)
    assert [place["local_rank"] for place in data["ranks"]] == [0, 1]


def test_a_probe_beyond_memory_names_probe_mib_not_nccl(tmp_path):
    """16 GiB per rank under a 6 GiB address-space limit: no rank can hold the buffer."""
    report = tmp_path / "doctor.json"
    done = subprocess.run(["prlimit", f"--as={6 * 2**30}", sys.executable, "-m",
                           "torch.distributed.run", "--standalone", "--nproc-per-node=2", "-m",
                           "workload.doctor", "--device", "cpu", *FAST, "--probe-mib", "16384",
                           "--json", str(report), "--output-dir", str(tmp_path / "runs")],
                          capture_output=True, text=True, timeout=300, env=clean_env(),
                          cwd=tmp_path)
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    probe, = by_check(json.loads(report.read_text()), "allreduce")
    assert probe["status"] == "fail" and "--probe-mib 16384 does not fit" in probe["detail"]
    assert "--probe-mib" in probe["fix"] and "NCCL" not in probe["fix"], probe


@pytest.mark.slurm
def test_four_ranks_on_two_slurm_nodes_per_task(slurm_cluster, tmp_path):
    report = tmp_path / "doctor.json"
    done = slurm_cluster.run([*SRUN, "-N2", "-n4", *DOCTOR, "--device", "cpu", *FAST,
                              "--json", str(report), "--output-dir", str(tmp_path / "runs")],
                             cwd=tmp_path)
    data = check_job(done, report, ranks=4, nodes=2)
    assert [(p["node"], p["local_rank"]) for p in data["ranks"]] == [
        ("nid001", 0), ("nid001", 1), ("nid002", 0), ("nid002", 1)]


@pytest.mark.slurm
def test_four_ranks_on_two_slurm_nodes_torchrun_per_node(slurm_cluster, tmp_path):
    report = tmp_path / "doctor.json"
    # As the launch tests start train: the entrypoint resolves torchrun's node arguments.
    done = slurm_cluster.run([*SRUN, "-N2", "--ntasks-per-node=1", str(REPO / "entrypoint.sh"),
                              "torchrun", "--nproc-per-node=2", "--no-python", "doctor",
                              "--device", "cpu",
                              *FAST, "--json", str(report),
                              "--output-dir", str(tmp_path / "runs")], cwd=tmp_path)
    data = check_job(done, report, ranks=4, nodes=2)
    assert sorted(p["node"] for p in data["ranks"]) == ["nid001"] * 2 + ["nid002"] * 2
