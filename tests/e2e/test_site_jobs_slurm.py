"""Every job script under jobs/sites/ on the private SLURM cluster, as a user submits it.

Only what this cluster cannot have is replaced: the GPU request (no GPUs here) and the
sizes (2 CPUs a node), given on the sbatch line; the site's container runtime by the
local one (RUNTIME=none: the host's Python); `module` is Lmod itself over the module
files of the site's twin, Olivia's NCCL modules (stand-in library folders) found only
after NRIS/GPU, as on Olivia (tests/twins/site_modules.py). The
rest -- the site file sourced, the NCCL binds and match check, the data staging, the
preset, jobs/lib/launch.sh and its two-node step -- runs as on the site. The step runs
in LAUNCH_CHECK mode (`python -m workload.launch check` in every task, the layout the
training would get); tests/e2e/test_slurm_launch.py trains through the same launch.sh.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO
from tests.slurm.jobs import sbatch, wait_until_ended
from tests.twins.site_modules import olivia_settings, site_modules
from tests.slurm.cluster import SUITE_ACCOUNT

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

SITES = REPO / "jobs" / "sites"


def alliance_settings(tmp_path: Path) -> dict[str, str]:
    data = tmp_path / "project" / "data"
    data.mkdir(parents=True)
    (data / "README").write_text("the dataset folder, staged to each node")
    return {"DATASET_ARCHIVE": str(data), "SLURM_TMPDIR": str(tmp_path / "localscratch"),
            **site_modules("alliance", tmp_path)}


# Shifter on this machine: the host itself, with each -V SOURCE:TARGET applied to the
# command's arguments (an argument naming TARGET names SOURCE), as the container would see.
SHIFTER = f"""#!{sys.executable}
import os, sys
args, binds = sys.argv[1:], []
while args and args[0] in ("-V", "--volume") or args and args[0].startswith("--image="):
    if args[0].startswith("--image="):
        args.pop(0)
        continue
    source, target = args[1].split(":")[:2]
    binds.append((target, source))
    args = args[2:]
for target, source in binds:
    args = [source + a[len(target):] if a == target or a.startswith(target + "/") else a
            for a in args]
os.execvp(args[0], args)
"""


def nersc_settings(tmp_path: Path) -> dict[str, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "shifter").write_text(SHIFTER)
    (bin_dir / "shifter").chmod(0o755)
    return {"PATH": f"{bin_dir}:{os.environ['PATH']}", "SCRATCH": str(tmp_path)}


SETTINGS = {"alliance.sbatch": alliance_settings, "sigma2-olivia.sbatch": olivia_settings,
            "nersc-perlmutter.sbatch": nersc_settings,
            "jsc-juwels-booster.sbatch": lambda tmp_path: {}}
# Sizes for a cluster of 2 CPUs a node: Perlmutter's script starts a task per GPU itself.
SIZES = {"nersc-perlmutter.sbatch": ["--ntasks-per-node=2", "--cpus-per-task=1"]}
# Header lines for what this cluster has not: GPUs and the memory that goes with them
# (--mem-per-gpu; the sbatch line gives --mem), and NERSC's Shifter image, modules and
# node feature (the image's part is the local `shifter` above), and the centre's QOS (the
# cluster's accounting holds the suite's only; the page test runs it in the centre's twin).
SITE_ONLY = ("#SBATCH --gpus", "#SBATCH --mem", "#SBATCH --image", "#SBATCH --module",
             "#SBATCH --constraint", "#SBATCH --qos")


def submit(slurm_cluster, tmp_path: Path, script: str, settings: dict[str, str]):
    text = (SITES / script).read_text()
    job = tmp_path / script
    job.write_text("".join(row for row in text.splitlines(keepends=True)
                           if not row.startswith(SITE_ONLY)))
    out = tmp_path / "job.out"
    env = slurm_cluster.env | {"JOBS_DIR": str(REPO / "jobs"), "RUNTIME": "none",
                               "GPUS_PER_NODE": "2", "LAUNCH_CHECK": "1", **settings}
    job_id = sbatch(slurm_cluster, ["--nodes=2", "--cpus-per-task=2", "--mem=1G",
                                    "--partition=debug", f"--account={SUITE_ACCOUNT}", "--time=10",
                                    *SIZES.get(script, []), "--output", str(out), str(job)],
                    env=env, cwd=tmp_path)
    state = wait_until_ended(slurm_cluster, job_id, out)
    return state, (out.read_text() if out.exists() else ""), tmp_path / "runs" / str(job_id)


def test_every_site_job_script_has_a_case_here():
    assert sorted(path.name for path in SITES.glob("*.sbatch")) == sorted(SETTINGS)


@pytest.mark.parametrize("script", sorted(SETTINGS))
def test_the_site_job_script_runs_its_step_on_two_nodes(slurm_cluster, tmp_path, script):
    state, log, _ = submit(slurm_cluster, tmp_path, script, SETTINGS[script](tmp_path))
    assert state == "COMPLETED", log[-3000:]
    # 2 nodes x GPUS_PER_NODE=2 tasks, each reporting a sound layout.
    assert log.count("layout: per-task, rank") == 4 and log.count("check: ok") == 4, log
    if script == "alliance.sbatch":
        assert (tmp_path / "localscratch" / "data" / "README").exists()
    if script == "jsc-juwels-booster.sbatch":  # the rendezvous on the InfiniBand name
        assert log.count("rendezvous nid001i:") == 4, log
        assert "preset jsc-juwels-booster: NCCL_SOCKET_IFNAME=ib0" in log
    if script == "sigma2-olivia.sbatch":
        assert re.search(r"nccl: bound libnccl 99\.29\.2 \(.*\) >= 2\.\d+\.\d+ torch was", log), log
        assert "preset sigma2-olivia: NCCL_PROTO=^LL128" in log


def test_olivia_stops_before_training_when_the_module_nccl_is_older(slurm_cluster, tmp_path):
    settings = olivia_settings(tmp_path, nccl_library="2.0.1")
    state, log, run_dir = submit(slurm_cluster, tmp_path, "sigma2-olivia.sbatch", settings)
    assert state == "FAILED", log[-3000:]
    [line] = [row for row in log.splitlines() if row.startswith("nccl:")]
    assert "the bound libnccl 2.0.1" in line and "older than" in line
    # Olivia's modules (the twin's list) are named for NCCL 2.30.4 and 2.29.2: the line
    # names the module new enough for this torch, or says that none is.
    assert "NCCL_MODULE=NCCL/2.30.4-" in line or "load an NCCL module >=" in line, line
    assert not run_dir.exists()  # nothing started
