"""The commands our help texts print, run as printed on the private SLURM cluster.

`python -m workload.launch jobs DEST` prints the line that submits the copied scripts;
`doctor --help` prints a torchrun line for one task per node. Both once led to failing
commands (a DEST not named jobs; $MASTER_ADDR expanded in the submitting shell, where it
is unset), so each test takes the line from the command's own output and runs it, changed
only where this cluster differs from a GPU site (no GPUs, no image: the host's Python).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from tests.helpers import DOCTOR_FAST, REPO
from tests.slurm.jobs import wait_until_ended

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


def test_the_submit_line_printed_by_launch_jobs_works_for_any_dest(slurm_cluster, tmp_path):
    dest = tmp_path / "site" / "my-jobs"  # not named jobs: the case that failed
    done = subprocess.run([sys.executable, "-m", "workload.launch", "jobs", str(dest)],
                          capture_output=True, text=True, cwd=REPO, check=True)
    [line] = [text.strip() for text in done.stdout.splitlines() if "sbatch" in text]
    # This cluster has no GPUs and 2 CPUs a node: the copy's GPU request goes, and the
    # sizes are given on the sbatch line (options there win over the header).
    script = dest / "multinode.sbatch"
    script.write_text("".join(row for row in script.read_text().splitlines(keepends=True)
                              if not row.startswith("#SBATCH --gpus")))
    out = tmp_path / "job.out"
    sized = line.replace("sbatch ", f"sbatch --parsable --cpus-per-task=2 --time=10 "
                                    f"--output={out} ", 1)
    env = slurm_cluster.env | {"RUNTIME": "none", "GPUS_PER_NODE": "2", "LAUNCH_CHECK": "1"}
    env.pop("JOBS_DIR", None)
    submitted = subprocess.run(["bash", "-c", sized], env=env, cwd=tmp_path,
                               capture_output=True, text=True, timeout=60)
    assert submitted.returncode == 0, submitted.stderr
    job = int(submitted.stdout.strip().split(";")[0])
    state = wait_until_ended(slurm_cluster, job, out)
    log = out.read_text()
    assert state == "COMPLETED", log[-3000:]
    assert log.count("check: ok") == 4, log


def test_the_torchrun_line_of_doctor_help_runs_as_printed(slurm_cluster, tmp_path):
    text = subprocess.run([sys.executable, "-m", "workload.doctor", "--help"],
                          capture_output=True, text=True, check=True).stdout
    block = re.search(r"\n( *srun [^\n]*\\\n(?:[^\n]*\\\n)*[^\n]*-m workload\.doctor[^\n]*)",
                      text)
    assert block, text
    line = block.group(1).replace("\\\n", " ")
    # No image here: the host runs what `apptainer exec --nv image.sif` would run, with
    # the checkout's entrypoint.sh and one CPU process per node instead of four GPUs (the
    # rendezvous across the two nodes is what the printed line got wrong).
    line = line.replace("apptainer exec --nv image.sif", "")
    line = line.replace("entrypoint.sh", str(REPO / "entrypoint.sh"))
    line = line.replace("--nproc-per-node=4", "--nproc-per-node=1")
    line = re.sub(r"--cpus-per-task=\d+", "--cpus-per-task=1", line)
    report = tmp_path / "doctor.json"
    # Small probes, as the suite's other doctor runs (DOCTOR_FAST): the default sweep
    # up to 256 MiB over gloo took about 22 of the test's 31 CPU-seconds here.
    done = subprocess.run(["bash", "-c", f"{line} --device cpu {' '.join(DOCTOR_FAST)} "
                                         f"--json {report}"],
                          env=slurm_cluster.env, cwd=tmp_path, capture_output=True,
                          text=True, timeout=300)
    log = done.stdout + done.stderr
    assert done.returncode == 0, log[-4000:]
    data = json.loads(report.read_text())
    assert data["world_size"] == 2 and len({p["node"] for p in data["ranks"]}) == 2
