"""Every value a site file sets, held against a table of what the centre publishes.

One table per site: the preset's exports, the EDF's keys (the file parsed as the CE's
EDF reference describes it: TOML, mounts as SOURCE:DESTINATION[:FLAGS], env values
strings), and the job script's #SBATCH resources. Each row names the page it comes from
and the date it was read, so a centre's change is a one-line diff here and in the file.
"""

from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path

import pytest

from tests.helpers import REPO

JOBS = REPO / "jobs"
READ = "2026-11-24"  # the date the pages below were read
READ_AGAIN = "2026-11-25"  # pages read again for the recipes' fixes (Olivia, CSCS build)

CSCS_NCCL = "https://docs.cscs.ch/software/communication/nccl/"
CSCS_PYTORCH = "https://docs.cscs.ch/software/ml/pytorch/"
CSCS_EDF = "https://docs.cscs.ch/software/container-engine/edf/"
CSCS_HOOK = "https://docs.cscs.ch/software/container-engine/resource-hook/"
CSCS_MLP = "https://docs.cscs.ch/platforms/mlp/"
TORCH_121055 = "https://github.com/pytorch/pytorch/issues/121055"
OLIVIA_NCCL = "https://documentation.sigma2.no/hpc_machines/olivia/nccl.html"
OLIVIA_MULTINODE = ("https://documentation.sigma2.no/code_development/guides/pytorch_olivia/"
                    "PyTorchMultiNode.html")
OLIVIA_JOB_TYPES = "https://documentation.sigma2.no/jobs/job_types/olivia_job_types.html"
OLIVIA_UPGRADE = "https://documentation.sigma2.no/hpc_machines/olivia/system_upgrade_Apr2026.html"
OLIVIA_STACK = "https://documentation.sigma2.no/hpc_machines/olivia/software_stack.html"
OLIVIA_START = ("https://documentation.sigma2.no/code_development/guides/pytorch_olivia/"
                "getting_started.html")
OLIVIA_SINGLE = ("https://documentation.sigma2.no/code_development/guides/pytorch_olivia/"
                 "PyTorchSingleGpu.html")
OLIVIA_ACCOUNTING = "https://documentation.sigma2.no/jobs/projects_accounting.html"
OLIVIA_APPTAINER = "https://documentation.sigma2.no/hpc_machines/olivia/nccl_apptainer.html"
APPTAINER_ENV = "https://apptainer.org/docs/user/latest/environment_and_metadata.html"
NERSC_SCRIPTS = "https://github.com/NERSC/sc25-dl-tutorial"
NERSC_POLICY = "https://docs.nersc.gov/jobs/policy/"
# JSC's own pages could not be read: these values are marked "NOT CONFIRMED" in the files,
# but for the node's shape (JSC's Booster overview) and the partition (JSC's own tutorial).
JUWELS_BOOSTER = "https://apps.fz-juelich.de/jsc/hps/juwels/booster-overview.html"
JSC_TUTORIAL = "https://github.com/FZJ-JSC/tutorial-multi-gpu"
UNCONFIRMED = ""
ALLIANCE_GPUS = "https://docs.alliancecan.ca/wiki/Using_GPUs_with_Slurm"
ALLIANCE_BUNDLES = ("https://docs.alliancecan.ca/wiki/Allocations_and_compute_scheduling"
                    "#Ratios_in_bundles")

# name -> (value, the page that publishes it)
PRESETS: dict[str, dict[str, tuple[str, str]]] = {
    "slingshot-gh200": {
        "NCCL_NET": ("AWS Libfabric", CSCS_NCCL),
        "NCCL_NET_GDR_LEVEL": ("PHB", CSCS_NCCL),
        "NCCL_CROSS_NIC": ("1", CSCS_NCCL),
        "NCCL_PROTO": ("^LL128", CSCS_NCCL),
        "FI_CXI_DEFAULT_CQ_SIZE": ("131072", CSCS_NCCL),
        "FI_CXI_DEFAULT_TX_SIZE": ("16384", CSCS_NCCL),
        "FI_CXI_DISABLE_HOST_REGISTER": ("1", CSCS_NCCL),
        "FI_CXI_RX_MATCH_MODE": ("software", CSCS_NCCL),
        "FI_MR_CACHE_MONITOR": ("userfaultfd", CSCS_NCCL),
        "MPICH_GPU_SUPPORT_ENABLED": ("0", CSCS_PYTORCH),
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": ("3", TORCH_121055),
    },
    "sigma2-olivia": {
        "HSA_FORCE_FINE_GRAIN_PCIE": ("1", OLIVIA_NCCL),
        "FI_MR_CACHE_MONITOR": ("userfaultfd", OLIVIA_NCCL),
        "FI_CXI_DISABLE_HOST_REGISTER": ("1", OLIVIA_NCCL),
        "FI_CXI_DEFAULT_CQ_SIZE": ("131072", OLIVIA_NCCL),
        "FI_CXI_RDZV_PROTO": ("alt_read", OLIVIA_NCCL),
        "FI_CXI_RDZV_EAGER_SIZE": ("0", OLIVIA_NCCL),
        "FI_CXI_RDZV_THRESHOLD": ("0", OLIVIA_NCCL),
        "FI_CXI_RDZV_GET_MIN": ("0", OLIVIA_NCCL),
        "FI_CXI_DEFAULT_TX_SIZE": ("2048", OLIVIA_NCCL),
        "NCCL_CROSS_NIC": ("1", OLIVIA_NCCL),
        "NCCL_NET_GDR_LEVEL": ("PHB", OLIVIA_NCCL),
        "NCCL_SOCKET_IFNAME": ("hsn0,hsn1,hsn2,hsn3", OLIVIA_NCCL),
        "FI_CXI_RX_MATCH_MODE": ("hybrid", OLIVIA_NCCL),
        "NCCL_PROTO": ("^LL128", OLIVIA_MULTINODE),
        "NCCL_NET": ("AWS Libfabric", CSCS_NCCL),
    },
    "jsc-juwels-booster": {
        "NCCL_SOCKET_IFNAME": ("ib0", UNCONFIRMED),
        "GLOO_SOCKET_IFNAME": ("ib0", UNCONFIRMED),
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": ("3", TORCH_121055),
    },
    "debug-nccl": {
        "NCCL_DEBUG": ("INFO", "https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html"),
        "NCCL_DEBUG_SUBSYS": ("INIT,NET",
                              "https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html"),
        "TORCH_DISTRIBUTED_DEBUG": ("DETAIL", ""),
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": ("3", TORCH_121055),
    },
}

# The EDF as a whole, after TOML parsing; <scratch> is the user's $SCRATCH, written in by
# sed: /capstor/... on Daint and Santis, /iopsstor/... on Clariden (CSCS_FILESYSTEMS below).
CSCS_EDF_TABLE = {
    "image": ("<scratch>/ce-images/hpc-train+0.1.0.sqsh", CSCS_EDF),
    "mounts": (["/capstor:/capstor", "/iopsstor:/iopsstor"], CSCS_EDF),
    "workdir": ("/capstor/scratch/cscs/<user>", CSCS_MLP),
    "entrypoint": (False, CSCS_EDF),
    "annotations": ({"com": {"hooks": {"aws_ofi_nccl": {"enabled": "true",
                                                        "variant": "cuda-dl"}}}}, CSCS_HOOK),
    "env": ({"NCCL_NET": "AWS Libfabric", "NCCL_PROTO": "^LL128",
             "TORCH_NCCL_ASYNC_ERROR_HANDLING": "3", "MPICH_GPU_SUPPORT_ENABLED": "0",
             "CUDA_CACHE_DISABLE": "1"}, CSCS_PYTORCH),
}

# The #SBATCH resources of each site job script.
RESOURCES: dict[str, dict[str, tuple[str, str]]] = {
    "sigma2-olivia.sbatch": {
        "--nodes": ("2", OLIVIA_MULTINODE), "--ntasks-per-node": ("1", OLIVIA_MULTINODE),
        "--gpus-per-node": ("4", OLIVIA_JOB_TYPES),
        # This project's choice, said as such: the node's 288 (the job types page), 72 per
        # GPU (the single-GPU guide); the multi-node guide asks 72 per node.
        "--cpus-per-task": ("288", OLIVIA_JOB_TYPES),
        "--mem": ("440G", OLIVIA_MULTINODE), "--partition": ("accel", OLIVIA_JOB_TYPES),
    },
    "nersc-perlmutter.sbatch": {
        "--constraint": ("gpu", NERSC_SCRIPTS), "--ntasks-per-node": ("4", NERSC_SCRIPTS),
        "--gpus-per-node": ("4", NERSC_SCRIPTS), "--cpus-per-task": ("32", NERSC_SCRIPTS),
        "--module": ("gpu,nccl-plugin", NERSC_SCRIPTS),
        "--qos": ("regular", NERSC_POLICY),
        # The user's own image, on the sbatch line: no published one to name here.
        "--image": (None, UNCONFIRMED),
    },
    "jsc-juwels-booster.sbatch": {
        "--partition": ("booster", JSC_TUTORIAL), "--gpus-per-node": ("4", JUWELS_BOOSTER),
        "--cpus-per-task": ("48", JUWELS_BOOSTER),
    },
    "alliance.sbatch": {
        # Fir's: the GPU model its job_submit requires, and its H100 bundle (12 cores,
        # 288 GB a GPU, 280 GB recommended); memory per GPU, not --mem=0 (a whole node).
        "--nodes": ("2", ""), "--ntasks-per-node": ("1", ""),
        "--gpus-per-node": ("h100:4", ALLIANCE_GPUS), "--cpus-per-task": ("48", ALLIANCE_BUNDLES),
        "--mem-per-gpu": ("280G", ALLIANCE_BUNDLES), "--mem": (None, ALLIANCE_BUNDLES),
    },
}


def preset_exports(name: str) -> dict[str, str]:
    """What sourcing jobs/presets/NAME.sh adds to an empty environment."""
    script = f'source "{JOBS / "presets" / f"{name}.sh"}"; env -0'
    done = subprocess.run(["env", "-i", "bash", "--norc", "-c", script], capture_output=True,
                          text=True, check=True)
    found = dict(item.split("=", 1) for item in done.stdout.split("\0") if "=" in item)
    return {k: v for k, v in found.items() if k not in ("PWD", "SHLVL", "_", "OLDPWD")}


def sbatch_resources(path: Path) -> dict[str, str]:
    options = re.findall(r"^#SBATCH (--[a-z-]+)=(\S+)", path.read_text(), re.M)
    return dict(options)


def cited(text: str, url: str) -> bool:
    return not url or url in text


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_each_preset_sets_the_published_values_and_cites_them(name):
    table = PRESETS[name]
    assert preset_exports(name) == {key: value for key, (value, _) in table.items()}
    text = (JOBS / "presets" / f"{name}.sh").read_text()
    missing = {url for _, url in table.values() if not cited(text, url)}
    assert not missing, f"{name}.sh does not name {missing}"
    if any(url.startswith("https://docs.cscs.ch") for _, url in table.values()):
        assert READ in text, f"{name}.sh does not say when its pages were read"
    if any("sigma2" in url for _, url in table.values()):
        assert READ_AGAIN in text, f"{name}.sh does not say when its pages were read"


def test_every_preset_file_has_a_table():
    assert sorted(p.stem for p in (JOBS / "presets").glob("*.sh")) == sorted(PRESETS)


def test_the_cscs_edf_holds_the_published_keys_in_the_documented_forms():
    path = JOBS / "sites" / "cscs-alps.toml"
    text = path.read_text()
    edf = tomllib.loads(text)
    assert edf == {key: value for key, (value, _) in CSCS_EDF_TABLE.items()}
    # The reference's mount form: SOURCE:DESTINATION[:FLAGS], absolute paths.
    for mount in edf["mounts"]:
        assert re.fullmatch(r"/[^:]*:/[^:]*(:[a-z+]+)?", mount), mount
    assert all(isinstance(v, str) for v in edf["env"].values())  # EDF env values are strings
    # No ${VAR}: the file means the same wherever the CE expands variables or not.
    assert "${" not in "".join(line.split("#")[0] for line in text.splitlines())
    for _, url in CSCS_EDF_TABLE.values():
        assert url in text, url
    assert READ in text


@pytest.mark.parametrize("script", sorted(RESOURCES))
def test_each_site_job_script_asks_for_the_published_resources(script):
    path = JOBS / "sites" / script
    found = sbatch_resources(path)
    table = RESOURCES[script]
    assert {key: found.get(key) for key in table} == {k: v for k, (v, _) in table.items()}
    text = path.read_text()
    for _, url in table.values():
        assert cited(text, url), url
    if any(url == UNCONFIRMED for _, url in table.values()) and script != "alliance.sbatch":
        assert "NOT CONFIRMED" in text  # said where it cannot be cited


def test_every_site_job_script_has_a_table():
    assert sorted(p.name for p in (JOBS / "sites").glob("*.sbatch")) == sorted(RESOURCES)


# Olivia's recipe: each fact on the page and in its files, next to the page it comes from.
# (value, the page that publishes it, the files that must carry both)
OLIVIA_PAGE = "docs/sites/sigma2-olivia.md"
OLIVIA_JOB = "jobs/sites/sigma2-olivia.sbatch"
OLIVIA_BINDS = "jobs/sites/sigma2-olivia-binds.sh"
OLIVIA_FACTS = [
    ("580.65.06", OLIVIA_UPGRADE, [OLIVIA_PAGE]),
    ("CUDA 13.0.0", OLIVIA_UPGRADE, [OLIVIA_PAGE]),
    ("x86_64", OLIVIA_START, [OLIVIA_PAGE]),
    ("http://10.63.2.48:3128/", OLIVIA_STACK, [OLIVIA_PAGE]),
    ("NRIS/GPU", OLIVIA_NCCL, [OLIVIA_PAGE, OLIVIA_JOB]),
    ("NCCL/2.29.2-GCCcore-14.3.0-CUDA-12.9.1", OLIVIA_NCCL, [OLIVIA_PAGE, OLIVIA_JOB]),
    ("/usr/lib64", OLIVIA_MULTINODE, [OLIVIA_PAGE, OLIVIA_BINDS]),
    ("FI_PROVIDER=cxi", OLIVIA_MULTINODE, [OLIVIA_PAGE, OLIVIA_BINDS]),
    ("--fakeroot", OLIVIA_APPTAINER, [OLIVIA_PAGE]),
    ("72", OLIVIA_MULTINODE, [OLIVIA_PAGE, OLIVIA_JOB]),
    ("72", OLIVIA_SINGLE, [OLIVIA_PAGE, OLIVIA_JOB]),
    ("GPU hours only", OLIVIA_ACCOUNTING, [OLIVIA_PAGE, OLIVIA_JOB]),
    ("not `PATH` or `LD_LIBRARY_PATH`", APPTAINER_ENV, [OLIVIA_PAGE]),
    ("not\n# LD_LIBRARY_PATH", APPTAINER_ENV, [OLIVIA_BINDS]),
]


@pytest.mark.parametrize("value,url,files", OLIVIA_FACTS, ids=lambda v: str(v)[:40])
def test_each_olivia_fact_is_cited_where_it_is_used(value, url, files):
    for name in files:
        text = (REPO / name).read_text()
        assert value in text, (name, value)
        assert url in text and READ_AGAIN in text, (name, url)


def test_olivia_loads_nris_gpu_before_its_nccl_module():
    """The NCCL modules are in NRIS/GPU (no stack is loaded at login): the job script and
    every command block of the page load it first, and the page's stale facts are gone."""
    job = (REPO / OLIVIA_JOB).read_text()
    assert job.index("module load NRIS/GPU") < job.index('module load "${NCCL_MODULE')
    assert job.index("module reset") < job.index("module load NRIS/GPU")
    page = (REPO / OLIVIA_PAGE).read_text()
    loading = [block for block in re.findall(r"```bash\n(.*?)```", page, re.S)
               if "module load NCCL" in block]
    assert loading, "no command block of the page loads an NCCL module: update the test"
    for block in loading:
        assert block.index("module load NRIS/GPU") < block.index("module load NCCL"), block
    for stale in ("R565", "-cuda12", "does not see", "cannot see"):
        assert stale not in page, stale
    assert "our choice" in page and "this project's choice" in job


# Facts of other pages, read 2026-11-25, each next to its page.
CSCS_BUILD = "https://docs.cscs.ch/build-install/containers/"
CSCS_FILESYSTEMS = "https://docs.cscs.ch/storage/filesystems/"
CSCS_RUN = "https://docs.cscs.ch/software/container-engine/run/"
CSCS_PYTHON = "https://docs.cscs.ch/build-install/python/"
CSCS_PAGE = "docs/sites/cscs-alps.md"
CSCS_TOML = "jobs/sites/cscs-alps.toml"
PAGE_FACTS = [
    (CSCS_PAGE, "enroot import -x mount -o", CSCS_BUILD),
    (CSCS_PAGE, "podman build --network=host -t", CSCS_BUILD),
    (CSCS_PAGE, "since 30.07.2026", CSCS_BUILD),
    (CSCS_PAGE, "'[storage]' 'driver = \"overlay\"' 'runroot = \"/dev/shm/$USER/runroot\"'",
     CSCS_BUILD),
    (CSCS_PAGE, """'graphroot = "/dev/shm/$USER/root"' > ~/.config/containers/storage.conf""",
     CSCS_BUILD),
    (CSCS_PAGE, "lfs setstripe -E 4M -c 1 -E 64M -c 4 -E -1 -c -1 -S 4M $SCRATCH/ce-images",
     CSCS_PYTORCH),
    (CSCS_PAGE, "`/capstor/scratch/cscs/$USER` on Daint\nand Santis", CSCS_FILESYSTEMS),
    (CSCS_PAGE, "`/iopsstor/scratch/cscs/$USER` on Clariden and Bristen", CSCS_FILESYSTEMS),
    (CSCS_TOML, "/iopsstor/scratch/cscs/$USER on Clariden and Bristen", CSCS_FILESYSTEMS),
    (CSCS_PAGE, "`${HOME}/.edf` is the default EDF search path", CSCS_RUN),
    (CSCS_PAGE, "Alps's compute nodes reach the internet through NAT",
     "https://docs.cscs.ch/guides/internet-access/"),
    (CSCS_PAGE, "unset PYTHONPATH\nexport PYTHONUSERBASE="
                "\"$(dirname \"$(dirname \"$(which python)\")\")\"\n"
                "python -m venv --system-site-packages", CSCS_PYTHON),
    ("docs/sites/pyxis.md", "`execute_entrypoint=1`", "https://github.com/NVIDIA/pyxis"),
    ("docs/sites/pyxis.md", "`--no-container-entrypoint`", "https://github.com/NVIDIA/pyxis"),
    ("docs/sites/pyxis.md", "`--container-writable` / `--container-readonly`",
     "https://github.com/NVIDIA/pyxis"),
    ("docs/hangs.md", "FI_CXI_RDZV_GET_MIN=0 FI_CXI_RDZV_THRESHOLD=0", CSCS_NCCL),
    ("docs/hangs.md", "FI_CXI_RDZV_EAGER_SIZE=0", CSCS_NCCL),
]


@pytest.mark.parametrize("name,value,url", PAGE_FACTS, ids=lambda v: str(v)[:40])
def test_each_page_fact_is_cited_with_its_date(name, value, url):
    text = (REPO / name).read_text()
    assert value in text and url in text and READ_AGAIN in text, (name, value, url)


def test_the_cscs_edf_names_the_image_where_step_1_writes_it():
    """$SCRATCH is /capstor/... on Daint but /iopsstor/... on Clariden: the EDF holds the
    <scratch> placeholder that step 2's sed fills with $SCRATCH, and with it filled in, its
    image is the file step 1's `enroot import -o` writes; its workdir, where the runs and
    their checkpoints go, is the user's Capstor scratch on every vCluster (<user>)."""
    edf = tomllib.loads((REPO / CSCS_TOML).read_text())
    page = (REPO / CSCS_PAGE).read_text()
    assert ('sed -e "s|<scratch>|$SCRATCH|g" -e "s|<user>|$USER|g" jobs/sites/cscs-alps.toml '
            "> ~/.edf/hpc-train.toml") in page
    assert edf["image"].startswith("<scratch>/"), edf["image"]
    assert edf["workdir"] == "/capstor/scratch/cscs/<user>", edf["workdir"]
    written = re.findall(r"enroot import -x mount -o (\S+) podman://", page)
    assert written == [edf["image"].replace("<scratch>", "$SCRATCH")], written


def test_the_alliance_venv_route_builds_the_wheel_with_the_python_module():
    """The package needs Python >= 3.10 (pyproject): `pip wheel` before `module load python`
    runs the login node's system pip; and the page names every dependency that the
    Alliance wheelhouse may lack (all but torch, torchvision and numpy)."""
    page = (REPO / "docs/sites/alliance.md").read_text()
    block = next(b for b in re.findall(r"```bash\n(.*?)```", page, re.S) if "pip wheel" in b)
    assert "module load python" in block
    assert block.index("module load python") < block.index("pip wheel"), block
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    names = [re.split(r"[<>=!~ ;\[]", dep)[0] for dep in project["dependencies"]]
    fetched = re.search(r"pip download --no-deps -d ~/wheels ([^`]*)`", page)
    assert fetched, "the page does not say how to fetch the missing wheels"
    own = [name for name in names if name not in ("torch", "torchvision", "numpy")]
    assert fetched.group(1).split() == own, (fetched.group(1), own)


@pytest.mark.parametrize("page", ["jsc-juwels-booster.md", "nersc-perlmutter.md"])
def test_a_page_that_picks_the_cuda12_flavour_says_the_driver_is_not_confirmed(page):
    """Neither centre's driver version was read from its pages: the flavour is this
    project's choice (R525 and newer run it), not something the job script or the centre
    fixes."""
    text = " ".join((REPO / "docs" / "sites" / page).read_text().split())
    assert "-cuda12" in text and "R525" in text
    assert re.search(r"driver version is (NOT CONFIRMED|not confirmed)", text), page
    assert "as the job script assumes" not in text


def test_the_uenv_route_sets_up_python_as_cscs_guide_says_before_each_use():
    """CSCS's guide for a venv on a uenv view: PYTHONPATH unset and PYTHONUSERBASE at the
    view's root before the venv is made, and so in the job step that uses it."""
    page = (REPO / CSCS_PAGE).read_text()
    route_b = page[page.index("## B. "):page.index("## The first lines")]
    checked = []
    for block in re.findall(r"```bash\n(.*?)```", route_b, re.S):
        for use in ("python -m venv", "venv/bin/activate"):
            if use in block:
                assert block.index("unset PYTHONPATH") < block.index("export PYTHONUSERBASE") \
                    < block.index(use), (use, block)
                checked.append(use)
    # The venv is made once and activated in the job: both uses are held, or the loops
    # above matched nothing and checked nothing (a renamed heading, a changed fence).
    assert sorted(set(checked)) == ["python -m venv", "venv/bin/activate"], checked
    assert checked.count("venv/bin/activate") >= 2, checked


def test_every_alliance_block_that_reads_data_dir_stages_it_first():
    """DATA_DIR is set by stage_dataset (jobs/sites/alliance-stage-data.sh) inside the job:
    a block that uses it without staging first passes an empty --data-dir."""
    page = (REPO / "docs/sites/alliance.md").read_text()
    users = [b for b in re.findall(r"```bash\n(.*?)```", page, re.S) if "$DATA_DIR" in b]
    assert len(users) >= 2, users
    for block in users:
        assert "source jobs/sites/alliance-stage-data.sh" in block, block
        assert block.index("stage_dataset ") < block.index("$DATA_DIR"), block


# Facts corrected after reading the centres again on 2026-11-28 (issue 46, W1-W11): each
# right value next to its page and the date, and the wrong form gone from the file.
READ_W = "2026-11-28"
CSCS_SLURM = "https://docs.cscs.ch/running/slurm/"
OLIVIA_OPENMPI = "https://documentation.sigma2.no/hpc_machines/olivia/openmpi.html"
APPTAINER_BINDS = "https://apptainer.org/docs/user/latest/bind_paths_and_mounts.html"
ALLIANCE_POLICY = "https://docs.alliancecan.ca/wiki/Scheduling_policy_updates"
ALLIANCE_PYTORCH = "https://docs.alliancecan.ca/wiki/PyTorch"
ALLIANCE_PAGE = "docs/sites/alliance.md"
NERSC_PAGE = "docs/sites/nersc-perlmutter.md"
# (W, file, right value or None, its page or "", the wrong form or None)
CORRECTIONS = [
    ("W1", CSCS_PAGE, "EDF=hpc-train DATA_DIR=$SCRATCH/data sbatch --cpus-per-task=288 "
     "jobs/multinode.sbatch", CSCS_SLURM, "EDF=hpc-train sbatch jobs/multinode.sbatch"),
    ("W2", ALLIANCE_PAGE, "`--gpus-per-node=h100:4`", ALLIANCE_POLICY, None),
    ("W2", "jobs/sites/alliance.sbatch", "#SBATCH --gpus-per-node=h100:4", ALLIANCE_POLICY,
     "#SBATCH --gpus-per-node=4"),
    ("W3", ALLIANCE_PAGE, None, ALLIANCE_BUNDLES, None),
    ("W3", "jobs/sites/alliance.sbatch", None, ALLIANCE_BUNDLES, "#SBATCH --mem=0"),
    ("W4", ALLIANCE_PAGE, "differs between the Alliance's clusters", "",
     "Compute nodes have no internet access"),
    ("W5", ALLIANCE_PAGE, "virtualenv --no-download $SLURM_TMPDIR/env && source "
     "$SLURM_TMPDIR/env/bin/activate", ALLIANCE_PYTORCH,
     "source ~/venv-hpc-train/bin/activate\nsource jobs/sites"),
    ("W6", OLIVIA_PAGE, "`srun --cpu-bind=verbose,cores`", OLIVIA_OPENMPI,
     "give no `--cpu-bind` advice"),
    ("W7", OLIVIA_PAGE, "apptainer exec --bind $WORK hpc-train.sif train", APPTAINER_BINDS,
     "apptainer exec hpc-train.sif train"),
    ("W8", "Dockerfile", None, "", "Olivia's R565"),
    ("W8", "docker-bake.hcl", None, "", "as Olivia uses"),
    ("W8", "apptainer/hpc-train-ngc.def", None, "", "as\n# Olivia uses"),
    ("W9", NERSC_PAGE, "--account=<project> --image=$IMAGE", "",
     "ghcr.io/hpc-train/hpc-train:0.1.0-cuda12"),
    ("W9", "jobs/sites/nersc-perlmutter.sbatch", None, "",
     "ghcr.io/hpc-train/hpc-train:0.1.0-cuda12"),
    ("W11", "docs/cluster.md", "not a whole node", "", "allocate whole nodes"),
    ("W11", "workload/launch/jobstep.py", None, "", "allocate whole nodes"),
    ("W11", "workload/launch/jobstep.py", None, "", "the job scripts allocate"),
]


@pytest.mark.parametrize("fix,name,right,url,wrong", CORRECTIONS,
                         ids=lambda v: str(v)[:30])
def test_each_corrected_fact_is_cited_and_its_wrong_form_gone(fix, name, right, url, wrong):
    text = (REPO / name).read_text()
    flat = " ".join(text.split())
    if right:
        assert " ".join(right.split()) in flat, (fix, name, right)
    if url:
        assert url in text and READ_W in text, (fix, name, url)
    if wrong:
        assert wrong not in text, (fix, name, wrong)


def test_the_job_scripts_table_names_every_site_script():
    """W10: docs/cluster.md's row for jobs/sites/ names each script there."""
    row = next(line for line in (REPO / "docs/cluster.md").read_text().splitlines()
               if line.startswith("| `jobs/sites/*.sbatch`"))
    scripts = sorted(path.name for path in (JOBS / "sites").glob("*.sbatch"))
    assert len(scripts) == 4, scripts
    assert [name for name in scripts if f"`{name}`" not in row] == [], row


# Facts found wrong on reading the centres again on 2026-12-04 (issue 60, A1-O2): each
# right value next to its page and that date, and the wrong form gone from the file.
READ_60 = "2026-12-04"
ALLIANCE_APPTAINER = "https://docs.alliancecan.ca/wiki/Apptainer"
ALLIANCE_FIR = "https://docs.alliancecan.ca/wiki/Fir"
OLIVIA_PRESET = "jobs/presets/sigma2-olivia.sh"
NVIDIA_NCCL_ENV = "https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html"
# NERSC's intended use of each QOS, read 2026-12-05 (docs.nersc.gov's own page gives the
# default QOS but its stored copy ends before "Policies").
NERSC_INTENT = "https://nersc.gitlab.io/jobs/policy/"
# (item, file, right value, its page, the wrong form or None)
CORRECTIONS_60 = [
    ("A1", ALLIANCE_PAGE, "`--mem-per-gpu=280G`", ALLIANCE_BUNDLES, "250 GB a GPU, Fir's"),
    ("A1", "jobs/sites/alliance.sbatch", "#SBATCH --mem-per-gpu=280G", ALLIANCE_BUNDLES,
     "#SBATCH --mem-per-gpu=250G"),
    ("A2", ALLIANCE_PAGE, "bash -c 'export APPTAINER_TMPDIR=$SLURM_TMPDIR && apptainer build",
     ALLIANCE_APPTAINER, "The data, once, on a login node"),
    ("A2", ALLIANCE_PAGE, "bash -c 'export APPTAINER_TMPDIR=$SLURM_TMPDIR && apptainer exec "
     "hpc-train.sif train --dataset cifar100", ALLIANCE_APPTAINER, None),
    ("A3", ALLIANCE_PAGE, "Fir's longest job is 7 days", ALLIANCE_FIR,
     "Fir's longest job, and whether"),
    ("N1", NERSC_PAGE, "sbatch -q regular --account=<project> --image=$IMAGE "
     "jobs/sites/nersc-perlmutter.sbatch --epochs 30", NERSC_POLICY, None),
    ("N1", NERSC_PAGE, "TRAIN_RUN_ID=<jobid> sbatch -q regular", NERSC_POLICY, None),
    ("N1", "jobs/sites/nersc-perlmutter.sbatch", "#SBATCH --qos=regular", NERSC_POLICY,
     "##SBATCH --qos=regular"),
    ("N1", NERSC_PAGE, '"production runs are not permitted in the debug QOS"', NERSC_INTENT,
     "as issue 60 reports it"),
    ("O1", OLIVIA_PAGE, "cuda 12.9", "", "cuda 13.x"),
    ("O2", OLIVIA_JOB, "NCCL/2.29.2-GCCcore-14.3.0-CUDA-12.9.1", OLIVIA_MULTINODE,
     "NCCL/2.30.4-GCCcore-14.3.0-CUDA-13.0.0}"),
    ("O2", OLIVIA_PAGE, "module load NCCL/2.29.2-GCCcore-14.3.0-CUDA-12.9.1", OLIVIA_MULTINODE,
     "module load NCCL/2.30.4"),
    ("O2", OLIVIA_PRESET, 'export NCCL_NET="AWS Libfabric"', NVIDIA_NCCL_ENV, None),
]


@pytest.mark.parametrize("fix,name,right,url,wrong", CORRECTIONS_60,
                         ids=lambda v: str(v)[:30])
def test_each_fact_corrected_for_issue_60_is_cited_and_its_wrong_form_gone(fix, name, right,
                                                                         url, wrong):
    text = (REPO / name).read_text()
    flat = " ".join(text.split())
    assert " ".join(right.split()) in flat, (fix, name, right)
    if url:
        assert url in text and READ_60 in text, (fix, name, url)
    if wrong:
        assert wrong not in text, (fix, name, wrong)
