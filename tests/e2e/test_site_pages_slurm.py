"""The page is the test: each site page's marked steps, typed in order into that centre's
twin on the suite's SLURM cluster (tests/helpers/twins.py, tests/twins/*.toml), reach
`train`'s first step on 2 nodes; and a page edited into a real mistake fails, naming it.
"""

from __future__ import annotations

import pytest

from tests.helpers import REPO
from tests.helpers.twins import FIRST_STEP, Twin, twin_data

pytestmark = [pytest.mark.sites, pytest.mark.slurm, pytest.mark.slow]

SITES = ["sigma2-olivia", "cscs-alps"]


def page_of(site: str) -> str:
    return (REPO / twin_data(site)["page"]).read_text()


def run_page(slurm_cluster, tmp_path, site: str, page: str):
    return Twin(site, slurm_cluster, tmp_path).run(page)


@pytest.mark.parametrize("site", SITES)
def test_the_page_reaches_the_first_training_step_on_two_nodes(slurm_cluster, tmp_path, site):
    result = run_page(slurm_cluster, tmp_path, site, page_of(site))
    assert result.status == 0, result.text()[-4000:]
    assert all(state == "COMPLETED" for state, _ in result.jobs.values()), result.text()[-4000:]
    text = result.text()
    assert FIRST_STEP.search(text), text[-4000:]
    # 2 nodes x 2 tasks: the cluster's 2 CPUs a node stand for the page's GPUs.
    assert "world size 4 (per-task)" in text, text[-4000:]


def mutated(site: str, old: str, new: str) -> str:
    page = page_of(site)
    assert page.count(old) == 1, f"{old!r} is not once on the page: update the mutation"
    return page.replace(old, new)


def test_olivia_running_the_arm64_image_on_the_login_node_fails(slurm_cluster, tmp_path):
    # Step 3 typed at the login prompt instead of in a job on a GPU node.
    page = mutated("sigma2-olivia", "srun --account=nnXXXXk --partition=accel --gpus=1 "
                   "--cpus-per-task=72 --mem=110G --time=00:30:00 \\\n  bash -c", "bash -c")
    result = run_page(slurm_cluster, tmp_path, "sigma2-olivia", page)
    assert result.status != 0 and not result.jobs
    assert ("the image's architecture (arm64) could not run on the host's (amd64)"
            in result.login), result.login[-3000:]


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
