"""Site recipes (jobs/sites/, jobs/presets/, docs/sites/): the presets sourced and printed
(their values against the centres' pages: tests/e2e/test_site_tables.py), the pyxis and
Container Engine srun lines of the docs run with a stub `srun` that prints its arguments,
enroot import, Olivia's binds, Alliance's staging to $SLURM_TMPDIR, and `train`'s warning
for relative folders that pyxis would put inside the container. Shellcheck covers every
file here (tests/e2e/test_entrypoint.py)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from tests.helpers import REPO
from tests.twins.site_modules import LMOD_BEHIND, olivia_settings
from workload.launch.jobstep import IGNORE_USR1

SITES, PRESETS, DOCS = REPO / "jobs" / "sites", REPO / "jobs" / "presets", REPO / "docs" / "sites"
LAUNCH_SH = REPO / "jobs" / "lib" / "launch.sh"

# Prints its arguments as JSON, one line per call; with STUB_RUN=1 it then runs the
# command after its options (a one-node srun), for the staging test.
STUB = f"""#!{sys.executable}
import json, os, subprocess, sys
with open(os.environ["STUB_LOG"], "a") as log:
    log.write(json.dumps([os.path.basename(sys.argv[0]), *sys.argv[1:]]) + "\\n")
if os.environ.get("STUB_RUN"):
    args = sys.argv[1:]
    while args and args[0].startswith("-"):
        args.pop(0)
    sys.exit(subprocess.call(args))
"""


@pytest.fixture()
def stubs(tmp_path) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("srun", "enroot", "module", "scontrol"):
        (bin_dir / name).write_text(STUB)
        (bin_dir / name).chmod(0o755)
    return bin_dir


def calls(stubs: Path) -> list[list[str]]:
    log = stubs.parent / "calls.jsonl"
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def bash(script: str, stubs: Path, **env: str) -> subprocess.CompletedProcess:
    base = {"PATH": f"{stubs}:/usr/bin:/bin", "STUB_LOG": str(stubs.parent / "calls.jsonl"),
            "HOME": str(stubs.parent)}
    return subprocess.run(["bash", "-c", f"set -Eeuo pipefail; {script}"], env=base | env,
                          cwd=stubs.parent, capture_output=True, text=True, timeout=60)


# ------------------------------------------------------------------ presets
PRESET_FILES = sorted(PRESETS.glob("*.sh"))


def preset_exports(path: Path, stubs: Path) -> dict[str, str]:
    """What sourcing the preset adds to an empty environment."""
    done = bash(f'source "{path}"; env -0', stubs)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    after = dict(item.split("=", 1) for item in done.stdout.split("\0") if "=" in item)
    return {k: v for k, v in after.items() if k not in ("PATH", "STUB_LOG", "HOME", "PWD",
                                                          "SHLVL", "_", "OLDPWD")}


@pytest.mark.parametrize("path", PRESET_FILES, ids=lambda p: p.name)
@pytest.mark.slow
def test_each_preset_is_plain_exports_that_the_job_log_shows(path, stubs):
    exported = preset_exports(path, stubs)
    names = re.findall(r"^export ([A-Z_0-9]+)=", path.read_text(), re.M)
    assert sorted(exported) == sorted(names)  # no other side effect
    # What the job log shows: the launch helper sources the preset, and the step's
    # computation (jobstep.py) prints what it set before srun starts.
    done = bash(f'source "{LAUNCH_SH}"; export PRESET={path.stem}; launch_train', stubs,
                JOBS_DIR=str(REPO / "jobs"), SLURM_JOB_ID="7")
    assert done.returncode == 0, done.stderr
    for name in names:
        assert f"preset {path.stem}: {name}={exported[name]}" in done.stderr


# ------------------------------------------------------------------ the docs' srun lines
def srun_lines(page: Path) -> list[str]:
    """The commands starting with srun in the page's bash blocks (continuations joined)."""
    blocks = re.findall(r"```bash\n(.*?)```", page.read_text(), re.S)
    joined = [line for block in blocks for line in block.replace("\\\n", " ").splitlines()]
    return [line.strip() for line in joined if line.strip().startswith("srun ")]


@pytest.mark.parametrize("page,expected", [
    ("pyxis.md", ["--container-image=", "--container-mounts=", "--container-workdir="]),
    ("cscs-alps.md", ["--environment="]),
])
def test_the_srun_lines_of_the_site_pages_run_as_written(stubs, page, expected):
    lines = srun_lines(DOCS / page)
    assert lines, f"no srun line in docs/sites/{page}"
    # The page's own settings (CPUS_PER_GPU=16), typed in a block before its srun lines.
    settings = "; ".join(re.findall(r"^([A-Z_][A-Z0-9_]*=\S+)$",
                                    (DOCS / page).read_text(), re.M)) or "true"
    for line in lines:
        done = bash(f"{settings}; {line}", stubs, SCRATCH="/scratch/me", USER="me",
                    SLURM_NNODES="2", SLURM_CPUS_ON_NODE="288")
        assert done.returncode == 0, (line, done.stderr)
    recorded = calls(stubs)
    assert len(recorded) == len(lines)
    for argv in recorded:
        assert argv[0] == "srun"
        first = next(arg for arg in argv[1:] if not arg.startswith("-"))
        if first not in ("train", "entrypoint.sh"):
            continue  # a step outside the image: enroot import, the uenv's bash
        options = [arg for arg in argv[1:] if arg.startswith("--")]
        for prefix in expected:
            assert any(o.startswith(prefix) for o in options), (argv, prefix)


@pytest.mark.parametrize("runtime,settings,expected", [
    ("pyxis", {"IMAGE": "/images/hpc-train.sqsh"},
     ["--container-image=/images/hpc-train.sqsh", "--container-mounts={pwd},/data",
      "--container-workdir={pwd}"]),
    # The job's node-local folder too, where SLURM gives one (docs/sites/pyxis.md).
    ("pyxis", {"IMAGE": "/images/hpc-train.sqsh", "SLURM_TMPDIR": "/localscratch/77"},
     ["--container-mounts={pwd},/data,/localscratch/77"]),
    ("edf", {"EDF": "/edf/hpc-train.toml"}, ["--environment=/edf/hpc-train.toml"]),
])
@pytest.mark.parametrize("layout", ["per-task", "torchrun"])
def test_container_runtimes_put_the_step_in_the_image(stubs, runtime, settings, expected,
                                                      layout):
    env = {"SLURM_JOB_ID": "77", "SLURM_NNODES": "2", "SLURM_GPUS_PER_NODE": "4",
           "SLURM_CPUS_PER_TASK": "72", "DATA_DIR": "/data", "RUNTIME": runtime,
           "LAYOUT": layout, **settings}
    done = bash(f'source "{LAUNCH_SH}"; launch_train --epochs 1', stubs, **env)
    assert done.returncode == 0, done.stderr
    [argv] = calls(stubs)
    pwd = str(stubs.parent)
    for option in expected:
        assert option.format(pwd=pwd) in argv, argv
    first = next(i for i, arg in enumerate(argv[1:], 1) if not arg.startswith("--"))
    command = argv[first:]
    # In the container, with SIGUSR1 ignored (docs/hangs.md): train itself, or
    # entrypoint.sh before torchrun.
    assert command[:len(IGNORE_USR1)] == IGNORE_USR1
    assert command[len(IGNORE_USR1):][:2] == (["train", "--dataset"] if layout == "per-task"
                                              else ["entrypoint.sh", "torchrun"])


def test_pyxis_import_runs_enroot_import_of_the_published_image(stubs, tmp_path):
    done = bash(f'"{SITES / "pyxis-import.sh"}"', stubs)
    assert done.returncode == 0, done.stderr
    assert calls(stubs) == [["enroot", "import", "--output", str(tmp_path / "hpc-train.sqsh"),
                             "docker://ghcr.io#hpc-train/hpc-train:0.1.0"]]
    (tmp_path / "hpc-train.sqsh").touch()
    done = bash(f'"{SITES / "pyxis-import.sh"}"', stubs)
    assert done.returncode == 2 and "exists" in done.stderr


# ------------------------------------------------------------------ Olivia and Alliance
def test_olivia_binds_the_module_libraries_only(stubs, tmp_path):
    dirs = {name: tmp_path / name for name in ("NCCL-2.26/lib", "aws-ofi-nccl/lib",
                                               "libfabric/lib64", "GCCcore/lib64")}
    for folder in dirs.values():
        folder.mkdir(parents=True)
    ld = ":".join(str(folder) for folder in dirs.values())
    (tmp_path / "usr-lib64").mkdir()
    done = bash(f'source "{SITES / "sigma2-olivia-binds.sh"}"; olivia_bind_nccl; '
                'echo "$APPTAINER_BIND"; echo "$APPTAINERENV_LD_LIBRARY_PATH"', stubs,
                LD_LIBRARY_PATH=ld, OLIVIA_CXI_DIR=str(tmp_path / "usr-lib64"))
    assert done.returncode == 0, done.stderr
    bind, libs = done.stdout.splitlines()
    wanted = [str(dirs[n]) for n in ("NCCL-2.26/lib", "aws-ofi-nccl/lib", "libfabric/lib64")]
    # The modules' folders, then the host's libcxi folder, as Olivia's guide binds them;
    # the image's own library path after them, evaluated in the container.
    cxi = tmp_path / "usr-lib64"
    assert bind == ",".join(f"{d}:{d}:ro" for d in [*wanted, str(cxi)])
    assert libs == ":".join([*wanted, str(cxi)]) + ":$LD_LIBRARY_PATH"
    assert "olivia: APPTAINER_BIND=" in done.stderr
    assert "olivia: FI_PROVIDER=cxi" in done.stderr
    done = bash(f'source "{SITES / "sigma2-olivia-binds.sh"}"; olivia_bind_nccl', stubs)
    assert done.returncode == 2 and "module load NRIS/GPU, then NCCL/..." in done.stderr


def run_olivia_job(stubs: Path, tmp_path: Path, text: str) -> subprocess.CompletedProcess:
    """The Olivia job script as its batch shell runs it: Olivia's module system (NCCL only
    after NRIS/GPU), the host's Python in place of the image (RUNTIME=none), a stub srun."""
    (stubs / "python3").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    (stubs / "python3").chmod(0o755)
    job = tmp_path / "sigma2-olivia.sbatch"
    job.write_text(text)
    env = {"PATH": f"{stubs}:/usr/bin:/bin", "STUB_LOG": str(stubs.parent / "calls.jsonl"),
           "HOME": str(tmp_path), "PYTHONPATH": str(REPO), "JOBS_DIR": str(REPO / "jobs"),
           "RUNTIME": "none", "OLIVIA_CXI_DIR": str(tmp_path / "usr-lib64"),
           "SLURM_JOB_ID": "7", "SLURM_NNODES": "2", "SLURM_GPUS_PER_NODE": "4",
           "SLURM_CPUS_PER_TASK": "288", **olivia_settings(tmp_path)}
    (tmp_path / "usr-lib64").mkdir()
    return subprocess.run(["bash", str(job)], env=env, cwd=tmp_path, capture_output=True,
                          text=True, timeout=300)


# Olivia's module system is Debian's Lmod, which only `make test` installs: these two are in
# the marked tier, so `make check` passes on a machine without it (.ci/run proves it).
@pytest.mark.root
def test_the_olivia_job_loads_its_modules_binds_and_checks_before_the_step(stubs, tmp_path):
    done = run_olivia_job(stubs, tmp_path, (SITES / "sigma2-olivia.sbatch").read_text())
    assert done.returncode == 0, done.stderr
    cxi = str(tmp_path / "usr-lib64")
    assert f"{cxi}:{cxi}:ro" in done.stderr and "olivia: FI_PROVIDER=cxi" in done.stderr
    assert "nccl: bound libnccl 99.29.2" in done.stdout
    assert [argv[0] for argv in calls(stubs)] == ["srun"]


@pytest.mark.root
def test_the_olivia_job_without_nris_gpu_stops_at_the_nccl_module(stubs, tmp_path):
    """The mistake the page once had: `module load NCCL/...` with no stack loaded. Lmod
    does not find the module, set -e ends the job, and no step starts."""
    text = (SITES / "sigma2-olivia.sbatch").read_text()
    assert "module load NRIS/GPU\n" in text
    done = run_olivia_job(stubs, tmp_path, text.replace("module load NRIS/GPU\n", ""))
    assert done.returncode == 1
    assert LMOD_BEHIND.format("NCCL/2.29.2-GCCcore-14.3.0-CUDA-12.9.1") in done.stderr
    assert calls(stubs) == []


def test_alliance_stages_the_dataset_once_per_node_to_slurm_tmpdir(stubs, tmp_path):
    archive = tmp_path / "cifar.tar.gz"
    (tmp_path / "cifar-100-python").mkdir()
    (tmp_path / "cifar-100-python" / "train").write_text("data")
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(tmp_path / "cifar-100-python", arcname="cifar-100-python")
    local = tmp_path / "localscratch"
    done = bash(f'source "{SITES / "alliance-stage-data.sh"}"; stage_dataset "{archive}"; '
                'echo "$DATA_DIR"', stubs, SLURM_TMPDIR=str(local), SLURM_NNODES="2",
                STUB_RUN="1")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(local / "data")
    assert (local / "data" / "cifar-100-python" / "train").read_text() == "data"
    [argv] = calls(stubs)
    assert argv[:4] == ["srun", "--ntasks=2", "--ntasks-per-node=1", "--cpus-per-task=1"]



def test_alliance_staging_on_a_shared_disk_never_mixes_two_copies(stubs, tmp_path):
    """Two nodes' tasks copying to one disk at once (what a test cluster on one host does)
    both succeed, and DATA_DIR holds one whole copy with no partial folder beside it."""
    source = tmp_path / "data"
    for i in range(200):
        (source / f"class-{i % 10}").mkdir(parents=True, exist_ok=True)
        (source / f"class-{i % 10}" / f"{i}.txt").write_text(str(i))
    local = tmp_path / "localscratch"
    stage = f'source "{SITES / "alliance-stage-data.sh"}"; stage_dataset "{source}"'
    # Each copy waited for by its pid: `wait -n` twice returns 127 at the second when both
    # ended before the first (bash 5.2; make check failed so on an idle machine).
    done = bash(f"({stage}) & first=$!; ({stage}) & second=$!; "
                'wait "$first" && wait "$second"', stubs,
                SLURM_TMPDIR=str(local), SLURM_NNODES="1", STUB_RUN="1")
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in local.iterdir()) == ["data"]
    copied = sorted(str(p.relative_to(local / "data")) for p in (local / "data").rglob("*.txt"))
    assert copied == sorted(str(p.relative_to(source)) for p in source.rglob("*.txt"))

# ------------------------------------------------------------------ train under pyxis
def test_train_warns_when_relative_folders_would_land_in_the_container(tmp_path, capsys,
                                                                        monkeypatch):
    from workload.train import parse_config, warn_container_paths

    image_workdir, submit = tmp_path / "workspace", tmp_path / "home"
    image_workdir.mkdir()
    submit.mkdir()
    monkeypatch.chdir(image_workdir)  # where pyxis starts: the image's WORKDIR
    for key, value in {"SLURM_JOB_ID": "5", "SLURM_SUBMIT_DIR": str(submit),
                       "SLURM_PROCID": "0"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("RANK", raising=False)
    warn_container_paths(parse_config(["--dataset", "cifar100", "--device", "cpu"]))
    err = capsys.readouterr().err
    assert "--output-dir runs/" in err and "--data-dir data is relative" in err
    assert f"--data-dir {submit / 'data'}" in err and "--container-workdir" in err
    assert f"it lands under {image_workdir}" in err and "the EDF's workdir" in err
    # Started in the submit folder (Apptainer, or pyxis with --container-workdir): quiet.
    monkeypatch.chdir(submit)
    warn_container_paths(parse_config(["--dataset", "cifar100", "--device", "cpu"]))
    assert capsys.readouterr().err == ""
    # Absolute folders are where the user said.
    monkeypatch.chdir(image_workdir)
    warn_container_paths(parse_config(["--dataset", "digits", "--device", "cpu",
                                       "--output-dir", str(submit / "runs" / "x")]))
    assert capsys.readouterr().err == ""

