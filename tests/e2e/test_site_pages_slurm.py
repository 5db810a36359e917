"""The page is the test: each site page's marked steps, typed in order into that centre's
twin on the suite's SLURM cluster (tests/helpers/twins.py, tests/twins/*.toml), reach
`train`'s first step on 2 nodes; and a page edited into a real mistake fails, naming it.
"""

from __future__ import annotations

import re

import pytest

from tests.helpers import REPO
from tests.helpers.twins import FIRST_STEP, Twin, twin_data

pytestmark = [pytest.mark.sites, pytest.mark.slurm, pytest.mark.slow]

# Each site's page, and the world size its job reaches: the cluster's 2 CPUs a node stand
# for the page's GPUs (2 nodes x 2 tasks where the page promises multi-node).
SITES = {"sigma2-olivia": 4, "cscs-alps": 4, "alliance": 2, "pyxis": 4, "nersc-perlmutter": 4,
         "jsc-juwels-booster": 4}


def page_of(site: str) -> str:
    return (REPO / twin_data(site)["page"]).read_text()


def run_page(slurm_cluster, tmp_path, site: str, page: str):
    return Twin(site, slurm_cluster, tmp_path).run(page)


@pytest.mark.parametrize("site", SITES)
def test_the_page_reaches_the_first_training_step(slurm_cluster, tmp_path, site):
    result = run_page(slurm_cluster, tmp_path, site, page_of(site))
    assert result.status == 0, result.text()[-4000:]
    assert all(state == "COMPLETED" for state, _ in result.jobs.values()), result.text()[-4000:]
    text = result.text()
    assert FIRST_STEP.search(text), text[-4000:]
    assert f"world size {SITES[site]} (per-task)" in text, text[-4000:]
    # Every training the page starts (job or srun at the login prompt) has the whole world:
    # a step with fewer tasks than the page promises is a broken step too.
    for log in [result.login, *(log for _, log in result.jobs.values())]:
        sizes = set(re.findall(r"train: .*, world size (\d+) ", log))
        assert sizes <= {str(SITES[site])}, (sizes, log[-3000:])
    # No launch warning tells the user to undo what the page had them type.
    assert "is already set and kept" not in text, text[-4000:]


def mutated(site: str, old: str, new: str) -> str:
    page = page_of(site)
    assert page.count(old) == 1, f"{old!r} is not once on the page: update the mutation"
    return page.replace(old, new)


def refused_at_login(slurm_cluster, tmp_path, site: str, page: str) -> str:
    """A page edited into a mistake that stops at the login prompt: the shell failed and
    no job was submitted. Returns what the login shell printed."""
    result = run_page(slurm_cluster, tmp_path, site, page)
    assert result.status != 0 and not result.jobs, result.login[-3000:]
    return result.login


def test_olivia_running_the_arm64_image_on_the_login_node_fails(slurm_cluster, tmp_path):
    # Step 3 typed at the login prompt instead of in a job on a GPU node.
    page = mutated("sigma2-olivia", "srun --account=nnXXXXk --partition=accel --gpus=1 "
                   "--cpus-per-task=72 --mem=110G --time=00:30:00 \\\n  bash -c", "bash -c")
    login = refused_at_login(slurm_cluster, tmp_path, "sigma2-olivia", page)
    assert "the image's architecture (arm64) could not run on the host's (amd64)" in login, \
        login[-3000:]


def test_olivia_loading_nccl_before_nris_gpu_fails(slurm_cluster, tmp_path):
    page = mutated("sigma2-olivia", "module load NRIS/GPU\nmodule load NCCL/2.30.4",
                   "module load NCCL/2.30.4-GCCcore-14.3.0-CUDA-13.0.0\nmodule load NRIS/GPU\n"
                   "module load NCCL/2.30.4")
    result = run_page(slurm_cluster, tmp_path, "sigma2-olivia", page)
    [failed] = [log for state, log in result.jobs.values() if state == "FAILED"]
    assert ('The following module(s) are unknown: "NCCL/2.30.4-GCCcore-14.3.0-CUDA-13.0.0"'
            in failed), failed[-3000:]


def test_cscs_an_edf_that_does_not_exist_fails(slurm_cluster, tmp_path):
    page = mutated("cscs-alps", "--kill-on-bad-exit=1 --environment=hpc-train \\\n     train",
                   "--kill-on-bad-exit=1 --environment=hpc-trian \\\n     train")
    result = run_page(slurm_cluster, tmp_path, "cscs-alps", page)
    assert result.status != 0
    assert "hpc-trian.toml (--environment=hpc-trian) does not exist" in result.login, \
        result.login[-3000:]


def test_alliance_apptainer_before_module_load_apptainer_fails(slurm_cluster, tmp_path):
    # Apptainer is a module on the Alliance clusters: not on PATH until it is loaded.
    page = mutated("alliance", "   module load apptainer\n   git clone", "   git clone")
    result = run_page(slurm_cluster, tmp_path, "alliance", page)
    assert result.status == 127 and not result.jobs
    assert "bash: apptainer: command not found" in result.login, result.login[-3000:]


def test_alliance_srun_without_ntasks_in_the_job_starts_one_task(slurm_cluster, tmp_path):
    # In the job, srun takes SLURM_NTASKS (the header's one task) over --ntasks-per-node.
    page = mutated("alliance", "srun --ntasks=4 --ntasks-per-node=4 --cpus-per-task=8 "
                   "--kill-on-bad-exit=1 \\\n     apptainer",
                   "srun --ntasks-per-node=4 --cpus-per-task=8 --kill-on-bad-exit=1 \\\n"
                   "     apptainer")
    result = run_page(slurm_cluster, tmp_path, "alliance", page)
    logs = [log for _, log in result.jobs.values()]
    assert any("world size 1 (per-task)" in log for log in logs), logs


def test_pyxis_cpus_from_a_job_variable_at_the_login_prompt_fails(slurm_cluster, tmp_path):
    # SLURM_CPUS_ON_NODE is a job's: typed at the login prompt, $((... / 4)) is 0.
    page = mutated("pyxis", "--cpus-per-task=$CPUS_PER_GPU",
                   "--cpus-per-task=$((SLURM_CPUS_ON_NODE / 4))")
    login = refused_at_login(slurm_cluster, tmp_path, "pyxis", page)
    assert 'srun: error: Invalid numeric value "0" for --cpus-per-task.' in login, \
        login[-3000:]


def test_pyxis_without_the_data_step_the_mount_is_missing(slurm_cluster, tmp_path):
    # The page as it was: no data step, and the run mounts $SCRATCH/data.
    page = mutated("pyxis", "<!-- step: login -->\n```bash\nmkdir -p $SCRATCH/data",
                   "```bash\nmkdir -p $SCRATCH/data")
    login = refused_at_login(slurm_cluster, tmp_path, "pyxis", page)
    assert re.search(r"pyxis: \[ERROR\] No such file or directory: \S+/scratch/\w+/data",
                     login), login[-3000:]


def test_nersc_running_the_image_before_shifterimg_pull_fails(slurm_cluster, tmp_path):
    page = mutated("nersc-perlmutter", "   <!-- step: login -->\n   ```bash\n   shifterimg pull",
                   "   ```bash\n   shifterimg pull")
    login = refused_at_login(slurm_cluster, tmp_path, "nersc-perlmutter", page)
    assert "image ghcr.io/hpc-train/hpc-train:0.1.0-cuda12 not found: pull it first" in login, \
        login[-3000:]


def test_nersc_the_by_hand_step_without_its_runs_folder_fails(slurm_cluster, tmp_path):
    # The by-hand step alone (not after the job script, which makes runs/ itself).
    page = mutated("nersc-perlmutter", "   <!-- step: login -->\n   ```bash\n   sbatch",
                   "   ```bash\n   sbatch")
    page = page.replace("   mkdir -p runs\n   srun", "   srun", 1)
    result = run_page(slurm_cluster, tmp_path, "nersc-perlmutter", page)
    [(state, log)] = result.jobs.values()
    assert state == "FAILED" and re.search(r"volume source \S+/runs \(-V", log), log[-3000:]
