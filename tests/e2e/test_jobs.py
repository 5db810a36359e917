"""jobs/: the launch helper (jobs/lib/launch.sh) and the job scripts, with a stub `srun`.

The stub prints the command line it was given as JSON (and the environment it saw), so
each case checks the exact srun form a layout, runtime and preset produce -- the one
train command, --kill-on-bad-exit=1, --cpus-per-task, torchrun's signals, docker's -e
list -- without a cluster. tests/e2e/test_slurm_launch.py runs the same scripts on the
private SLURM cluster.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO


JOBS = REPO / "jobs"
LAUNCH_SH = JOBS / "lib" / "launch.sh"
REQUEUE_SH = JOBS / "lib" / "requeue.sh"
SCRIPTS = sorted(JOBS.glob("*.sbatch"))
# The job script for a user's own script (FORM, SCRIPT); the others run `train`.
OWN_SCRIPT = JOBS / "own-script.sbatch"
TRAIN_SCRIPTS = [path for path in SCRIPTS if path != OWN_SCRIPT]

# The train command of every job script, before the extra arguments.
TRAIN = ["train", "--dataset", "cifar100", "--data-dir", "/data", "--batch-size", "256",
         "--epochs", "100", "--base-lr", "0.01", "--target-accuracy", "0.95", "--patience",
         "2", "--output-dir", "runs/77"]
# The step's command starts with SIGUSR1 ignored (docs/hangs.md: the on-demand stack dump
# must not kill torchrun, nor any process of the step before train's handler is there).
IGNORE_USR1 = ["bash", "-c", 'trap "" USR1 && exec "$@"', "ignore-usr1"]
APPTAINER = ["apptainer", "exec", "--nv", "--bind", "/data", "/images/hpc-train.sif",
             *IGNORE_USR1]
SIGNALS = "--signals-to-handle=SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR2"

# Records its arguments and a few variables, then exits with STUB_STATUS.
SRUN_STUB = f"""#!{sys.executable}
import json, os, sys
keys = ("NCCL_DEBUG", "TRAIN_REQUEUE_FILE")
with open(os.environ["STUB_LOG"], "a") as log:
    log.write(json.dumps({{"argv": sys.argv[1:],
                          "env": {{k: os.environ[k] for k in keys if k in os.environ}}}}) + "\\n")
sys.exit(int(os.environ.get("STUB_STATUS", "0")))
"""
RECORD_STUB = "#!/bin/sh\necho \"$(basename \"$0\") $*\" >> \"${STUB_CALLS}\"\n"


@pytest.fixture()
def stubs(tmp_path) -> Path:
    """A bin folder: srun as above; scontrol, apptainer, docker, torchrun, train record."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text(SRUN_STUB)
    for name in ("scontrol", "apptainer", "docker", "torchrun", "train", "sbatch"):
        (bin_dir / name).write_text(RECORD_STUB)
    for path in bin_dir.iterdir():
        path.chmod(0o755)
    return bin_dir


def base_env(stubs: Path, **settings: str) -> dict[str, str]:
    """What sbatch gives a 2-node job of 4 GPUs and 72 CPUs per node, one task per node."""
    env = {"PATH": f"{stubs}:/usr/bin:/bin", "STUB_LOG": str(stubs.parent / "srun.jsonl"),
           "STUB_CALLS": str(stubs.parent / "calls"), "SLURM_JOB_ID": "77",
           "SLURM_NNODES": "2", "SLURM_NTASKS_PER_NODE": "1", "SLURM_GPUS_PER_NODE": "4",
           "SLURM_CPUS_PER_TASK": "72", "DATA_DIR": "/data",
           "IMAGE": "/images/hpc-train.sif", "SLURM_SUBMIT_DIR": str(REPO)}
    return env | settings


def run_bash(script: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", script], env=env, cwd=cwd, capture_output=True,
                          text=True, timeout=60)


def launch(stubs: Path, *args: str, function: str = "launch_train", **settings: str):
    script = f'set -Eeuo pipefail; source "{LAUNCH_SH}"; {function} "$@"'
    done = subprocess.run(["bash", "-c", script, "job", *args], env=base_env(stubs, **settings),
                          cwd=stubs.parent, capture_output=True, text=True, timeout=60)
    return done, srun_calls(stubs)


def srun_calls(stubs: Path) -> list[dict]:
    log = stubs.parent / "srun.jsonl"
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def other_calls(stubs: Path) -> list[str]:
    calls = stubs.parent / "calls"
    return calls.read_text().splitlines() if calls.exists() else []


# Sourcing runs nothing ------------------------------------------------------------------

@pytest.mark.parametrize("helper", [LAUNCH_SH, REQUEUE_SH], ids=lambda p: p.name)
def test_sourcing_a_helper_runs_nothing(stubs, tmp_path, helper):
    """Sourcing defines functions only: no command, no output, no new variable."""
    script = (f'set -Eeuo pipefail; compgen -v | sort > {tmp_path}/before; '
              f'source "{helper}"; compgen -v | sort > {tmp_path}/after; '
              f'comm -13 {tmp_path}/before {tmp_path}/after; echo "--"; declare -F')
    env = {"PATH": f"{stubs}:/usr/bin:/bin", "STUB_LOG": str(tmp_path / "srun.jsonl"),
           "STUB_CALLS": str(tmp_path / "calls")}
    done = run_bash(script, env, tmp_path)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    new_variables, functions = done.stdout.split("--\n")
    assert new_variables == ""
    assert srun_calls(stubs) == [] and other_calls(stubs) == []
    defined = {line.split()[-1] for line in functions.splitlines()}
    expected = {"launch_train", "launch_train_requeueable", "launch_script"} \
        if helper == LAUNCH_SH \
        else {"run_requeueable"}
    assert expected <= defined


# The job scripts: a header and a call ---------------------------------------------------

def script_body(path: Path) -> list[str]:
    """The lines that are neither comments nor blank: the script's code."""
    return [line for line in path.read_text().splitlines()
            if line.strip() and not line.lstrip().startswith("#")]


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_each_job_script_is_its_header_and_a_few_lines(script):
    body = script_body(script)
    assert len(body) <= 3, body
    assert body[0] == "set -Eeuo pipefail"
    assert body[1] == 'source "${JOBS_DIR:-${SLURM_SUBMIT_DIR:-.}/jobs}/lib/launch.sh"'
    assert re.fullmatch(r'(LAYOUT=\S+ )?launch_(train(_requeueable)?|script)( --\S+ \S+)* "\$@"',
                        body[2]), body[2]


def sbatch_settings(script: Path) -> dict[str, str]:
    """The variables sbatch sets from the script's #SBATCH header (the parts used here)."""
    header = dict(re.findall(r"^#SBATCH --([a-z-]+)=(\S+)", script.read_text(), re.M))
    return {"SLURM_NNODES": header["nodes"], "SLURM_NTASKS_PER_NODE": header["ntasks-per-node"],
            "SLURM_GPUS_PER_NODE": header["gpus-per-node"],
            "SLURM_CPUS_PER_TASK": header["cpus-per-task"]}


# The generic scripts run on any site: a 4-GPU node of 48 cores (JUWELS Booster's A100
# nodes, docs/sites/jsc-juwels-booster.md) must be able to start them, so they ask at most
# 12 CPUs per GPU, and never a whole node of one site.
CPUS_PER_GPU_ANY_NODE_HAS = 12


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_each_generic_job_script_asks_cpus_any_gpu_node_has(script):
    settings = sbatch_settings(script)
    cpus, gpus = int(settings["SLURM_CPUS_PER_TASK"]), int(settings["SLURM_GPUS_PER_NODE"])
    tasks = int(settings["SLURM_NTASKS_PER_NODE"])
    assert cpus * tasks <= CPUS_PER_GPU_ANY_NODE_HAS * gpus, (script.name, cpus, gpus)
    assert "holds the node" not in script.read_text()


# Per script: the layout it uses, and the train arguments it adds before the user's.
EXPECTED = {"1gpu.sbatch": ("per-task", []), "1node-4gpu-per-task.sbatch": ("per-task", []),
            "1node-4gpu-torchrun.sbatch": ("torchrun", []), "multinode.sbatch": ("per-task", []),
            "requeue.sbatch": ("per-task", ["--checkpoint-every", "30m"])}


@pytest.mark.parametrize("script", TRAIN_SCRIPTS, ids=lambda p: p.name)
def test_each_job_script_runs_the_one_train_command(stubs, script):
    settings = sbatch_settings(script)
    env = base_env(stubs, **settings)  # GPUS_PER_NODE: from the header, through sbatch
    done = subprocess.run(["bash", str(script), "--epochs", "5"], env=env, cwd=stubs.parent,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    [call] = srun_calls(stubs)
    layout, added = EXPECTED[script.name]
    nodes, gpus = int(settings["SLURM_NNODES"]), int(settings["SLURM_GPUS_PER_NODE"])
    cpus = int(settings["SLURM_CPUS_PER_TASK"])
    train = [*TRAIN, *added, "--epochs", "5"]
    if layout == "per-task":
        assert call["argv"] == ["--kill-on-bad-exit=1", f"--ntasks={nodes * gpus}",
                                f"--ntasks-per-node={gpus}", f"--cpus-per-task={cpus // gpus}",
                                *APPTAINER, *train]
    else:
        assert call["argv"] == ["--kill-on-bad-exit=1", f"--ntasks={nodes}",
                                "--ntasks-per-node=1", f"--cpus-per-task={cpus}", *APPTAINER,
                                "entrypoint.sh", "torchrun", f"--nproc-per-node={gpus}",
                                SIGNALS, "--no-python", *train]


def test_the_default_layout_is_per_task_for_every_script():
    """One default, in the helper; only the torchrun example names a layout."""
    assert re.search(r"^  LAYOUT=\$\{LAYOUT:-per-task\}$", LAUNCH_SH.read_text(), re.M)
    named = {path.name for path in TRAIN_SCRIPTS if "LAYOUT=" in script_body(path)[-1]}
    assert named == {"1node-4gpu-per-task.sbatch", "1node-4gpu-torchrun.sbatch"}


# The helper, table-driven ---------------------------------------------------------------

def test_per_task_layout_splits_the_node(stubs):
    done, [call] = launch(stubs, "--epochs", "5")
    assert done.returncode == 0, done.stderr
    assert call["argv"] == ["--kill-on-bad-exit=1", "--ntasks=8", "--ntasks-per-node=4",
                            "--cpus-per-task=18", *APPTAINER, *TRAIN, "--epochs", "5"]


def test_torchrun_layout_runs_one_task_per_node_and_passes_usr2_on(stubs):
    done, [call] = launch(stubs, "--epochs", "5", LAYOUT="torchrun")
    assert done.returncode == 0, done.stderr
    assert call["argv"] == ["--kill-on-bad-exit=1", "--ntasks=2", "--ntasks-per-node=1",
                            "--cpus-per-task=72", *APPTAINER, "entrypoint.sh", "torchrun",
                            "--nproc-per-node=4", SIGNALS, "--no-python", *TRAIN,
                            "--epochs", "5"]


@pytest.mark.parametrize(("settings", "tasks"), [
    ({"GPUS_PER_NODE": "2"}, "--ntasks-per-node=2"),             # the setting wins
    ({"SLURM_GPUS_PER_NODE": "h100:2"}, "--ntasks-per-node=2"),  # a typed GPU request
    ({"SLURM_GPUS_PER_NODE": ""}, "--ntasks-per-node=1"),        # no GPUs asked for: 1
])
def test_gpus_per_node_is_the_one_process_count(stubs, settings, tasks):
    _, [call] = launch(stubs, **settings)
    assert tasks in call["argv"]
    _, calls = launch(stubs, LAYOUT="torchrun", **settings)
    assert f"--nproc-per-node={tasks.split('=')[1]}" in calls[-1]["argv"]


def test_without_cpus_per_task_srun_keeps_its_default(stubs):
    for layout in ("per-task", "torchrun"):
        done, calls = launch(stubs, LAYOUT=layout, SLURM_CPUS_PER_TASK="")
        assert done.returncode == 0, done.stderr
        assert not any(arg.startswith("--cpus-per-task") for arg in calls[-1]["argv"])


def test_docker_passes_the_task_variables_and_the_presets(stubs):
    done, [call] = launch(stubs, RUNTIME="docker", IMAGE="hpc-train:latest",
                          PRESET="debug-nccl")
    assert done.returncode == 0, done.stderr
    argv = call["argv"]
    docker = argv[argv.index("docker"):argv.index("hpc-train:latest")]
    passed = {docker[i + 1] for i, arg in enumerate(docker) if arg == "-e"}
    assert {"SLURM_PROCID", "SLURM_LOCALID", "CUDA_VISIBLE_DEVICES", "MASTER_ADDR",
            "TRAIN_REQUEUE_FILE", "NCCL_DEBUG", "TORCH_DISTRIBUTED_DEBUG"} <= passed
    assert docker[:3] == ["docker", "run", "--rm"] and "--network" in docker
    assert argv[argv.index("hpc-train:latest") + 1:] == [*IGNORE_USR1, *TRAIN]
    # The preset's exports reach srun, which passes them to the tasks.
    assert call["env"]["NCCL_DEBUG"] == "INFO"


def test_docker_torchrun_uses_the_image_entrypoint(stubs):
    _, [call] = launch(stubs, RUNTIME="docker", IMAGE="img", LAYOUT="torchrun")
    argv = call["argv"]
    start = argv.index("img") + 1 + len(IGNORE_USR1)
    assert argv[start:start + 2] == ["torchrun", "--nproc-per-node=4"]


def test_runtime_none_runs_on_the_host(stubs):
    _, [call] = launch(stubs, RUNTIME="none")
    assert call["argv"][4:] == [*IGNORE_USR1, *TRAIN]
    _, calls = launch(stubs, RUNTIME="none", LAYOUT="torchrun")
    command = calls[-1]["argv"][4 + len(IGNORE_USR1):]
    assert Path(command[0]).resolve() == REPO / "entrypoint.sh" and command[1] == "torchrun"


def test_entrypoint_setting(stubs):
    _, [call] = launch(stubs, LAYOUT="torchrun", ENTRYPOINT="/opt/ep.sh")
    assert call["argv"][4 + len(APPTAINER)] == "/opt/ep.sh"


@pytest.mark.parametrize(("layout", "check"), [
    ("per-task", ["python", "-m", "workload.launch", "check"]),
    ("torchrun", ["python", "-m", "workload.launch", "check", "--command", "torchrun"]),
])
def test_launch_check_runs_the_check_in_the_same_layout(stubs, layout, check):
    done, [call] = launch(stubs, LAYOUT=layout, LAUNCH_CHECK="1")
    assert done.returncode == 0, done.stderr
    assert call["argv"][-len(check) - len(APPTAINER):] == [*APPTAINER, *check]
    assert "train" not in call["argv"]


@pytest.mark.parametrize(("settings", "message"), [
    ({"LAYOUT": "mpi"}, "LAYOUT=mpi: expected per-task or torchrun"),
    ({"RUNTIME": "podman"}, "RUNTIME=podman: expected apptainer, docker, none, pyxis or edf"),
    ({"PRESET": "nope"}, "PRESET=nope: no "),
    ({"GPUS_PER_NODE": "0"}, "GPUS_PER_NODE=0: expected a whole number"),
    ({"SLURM_NTASKS_PER_NODE": "4"}, "set --gpus-per-node"),
    ({"SLURM_CPUS_PER_TASK": "2"}, "--cpus-per-task=2 cannot be split among GPUS_PER_NODE=4"),
])
def test_bad_settings_stop_before_srun(stubs, settings, message):
    done, calls = launch(stubs, **settings)
    assert done.returncode == 2 and message in done.stderr, done.stderr
    assert calls == []


def test_outside_sbatch_the_missing_job_id_is_named(stubs):
    script = f'set -Eeuo pipefail; source "{LAUNCH_SH}"; launch_train'
    env = base_env(stubs)
    del env["SLURM_JOB_ID"]
    done = run_bash(script, env, stubs.parent)
    assert done.returncode != 0 and "run the job scripts with sbatch" in done.stderr
    assert srun_calls(stubs) == []


# The requeue flow through the helper ----------------------------------------------------

# The decision after each step: `diagnose RUN_DIR --after-step STATUS ...` in the image.
DECIDE = "apptainer exec --nv --bind /data /images/hpc-train.sif diagnose runs/77"


def decision(status: int) -> str:
    return (f"{DECIDE} --after-step={status} --job=77 --requeue-asked= --allocation= "
            "--step-nodes= --down= --min-nodes=0 --max-without-progress=3")


def test_requeueable_launch_requeues_on_status_75(stubs):
    """The stub image answers no decision: the step's status decides, as without one."""
    done, [call] = launch(stubs, "--epochs", "5", function="launch_train_requeueable",
                          STUB_STATUS="75", LAYOUT="torchrun")
    assert done.returncode == 0, done.stderr
    assert other_calls(stubs) == [decision(75), "scontrol requeue 77"]
    assert "the step's status decides" in done.stderr
    assert SIGNALS in call["argv"]
    # The step sees the requeue file that train's preempted ranks write.
    assert call["env"]["TRAIN_REQUEUE_FILE"] == str(stubs.parent / ".train-requeue-77")


def test_requeueable_launch_passes_other_statuses_on(stubs):
    done, _ = launch(stubs, function="launch_train_requeueable", STUB_STATUS="3")
    assert done.returncode == 3 and other_calls(stubs) == [decision(3)]


def answering(stubs: Path, *answers: str) -> None:
    """The image's `diagnose` answers each decision with the next of `answers`."""
    for number, answer in enumerate(answers):
        (stubs.parent / f"answer-{number}").write_text(answer)
    (stubs / "apptainer").write_text(
        RECORD_STUB + 'n=$(grep -c diagnose "${STUB_CALLS}")\n'
        'cat "$(dirname "${STUB_CALLS}")/answer-$((n - 1))"\n')


def test_the_job_runs_what_the_decision_says(stubs):
    """restart on other nodes: the step again, on those; requeue: the nodes left behind
    excluded from the requeued job first."""
    answering(stubs, "action=restart\nnodes=nid001,nid003\nexclude=nid002\n",
              "action=requeue\nnodes=\nexclude=nid002\n")
    done, calls = launch(stubs, function="launch_train_requeueable", STUB_STATUS="1",
                         SLURM_JOB_NODELIST="nid[001-003]", SLURM_NNODES="3")
    assert done.returncode == 0, done.stderr
    assert [call["argv"][1:3] for call in calls] == [
        ["--ntasks=12", "--ntasks-per-node=4"], ["--nodes=2", "--nodelist=nid001,nid003"]]
    assert calls[1]["argv"][3] == "--ntasks=8"
    # SLURM takes ExcNodeList only from a pending job: the requeued one.
    assert other_calls(stubs)[-2:] == ["scontrol requeue 77",
                                       "scontrol update JobId=77 ExcNodeList=nid002"]
    assert "leaving nid002 behind" in done.stderr


def test_doctors_preflight_leaves_its_unfit_node_out_of_the_first_step(stubs):
    """PREFLIGHT=1: doctor on the whole allocation in the step's layout, then the
    decision on its report, whose nodes the first step runs on; with too few left, the
    job is requeued without the unfit node and no step runs."""
    answering(stubs, "action=restart\nnodes=nid001,nid003\nexclude=nid002\n",
              "action=done\nnodes=\nexclude=\n")
    done, calls = launch(stubs, "--epochs", "5", function="launch_train_requeueable",
                         SLURM_JOB_NODELIST="nid[001-003]", SLURM_NNODES="3", PREFLIGHT="1",
                         PREFLIGHT_ARGS="--sweep-max-mib 2")
    assert done.returncode == 0, done.stderr
    report = str(stubs.parent / ".train-preflight-77.json")
    assert calls[0]["argv"] == ["--kill-on-bad-exit=1", "--ntasks=12", "--ntasks-per-node=4",
                                "--cpus-per-task=18", *APPTAINER, "doctor", "--output-dir",
                                "runs/77", "--json", report, "--sweep-max-mib", "2"]
    assert calls[1]["argv"][:3] == ["--kill-on-bad-exit=1", "--nodes=2",
                                    "--nodelist=nid001,nid003"]
    assert other_calls(stubs)[0] == (
        f"{DECIDE} --preflight={report} --job=77 --allocation=nid[001-003] --step-nodes= "
        "--min-nodes=0")
    (stubs.parent / "calls").unlink()
    (stubs.parent / "srun.jsonl").unlink()
    answering(stubs, "action=requeue\nnodes=\nexclude=nid002\n")
    done, calls = launch(stubs, function="launch_train_requeueable", PREFLIGHT="1")
    assert done.returncode == 0, done.stderr
    assert [call["argv"][-4] for call in calls] == ["--output-dir"]  # doctor's alone
    assert other_calls(stubs)[-2:] == ["scontrol requeue 77",
                                       "scontrol update JobId=77 ExcNodeList=nid002"]


def test_preflight_is_1_or_0(stubs):
    done, calls = launch(stubs, function="launch_train_requeueable", PREFLIGHT="yes")
    assert done.returncode == 2 and calls == []
    assert done.stderr == "job: PREFLIGHT='yes': expected 1 (doctor before the first step) or 0\n"


@pytest.mark.parametrize(("status", "ends"), [(3, 3), (0, 1)])
def test_a_stop_ends_the_job_non_zero_without_a_requeue(stubs, status, ends):
    answering(stubs, "action=stop\nnodes=\nexclude=\n")
    done, calls = launch(stubs, function="launch_train_requeueable", STUB_STATUS=str(status))
    assert done.returncode == ends and len(calls) == 1
    assert not [call for call in other_calls(stubs) if call.startswith("scontrol")]


@pytest.mark.parametrize("answer", ["action=restart; rm -rf /\n", "action=reboot\n",
                                    "nodes=$(id)\naction=restart\n"])
def test_an_answer_that_is_not_a_decision_is_not_obeyed(stubs, answer):
    answering(stubs, answer)
    done, calls = launch(stubs, function="launch_train_requeueable", STUB_STATUS="3")
    assert done.returncode == 3 and len(calls) == 1
    assert "the step's status decides" in done.stderr


# A user's own script: the three forms ----------------------------------------------------

@pytest.mark.parametrize(("form", "tasks", "command"), [
    ("per-task", ["--ntasks=8", "--ntasks-per-node=4", "--cpus-per-task=18"],
     [*APPTAINER, "entrypoint.sh", "python", "my_train.py"]),
    ("torchrun", ["--ntasks=2", "--ntasks-per-node=1", "--cpus-per-task=72"],
     [*APPTAINER, "entrypoint.sh", "torchrun", "--nproc-per-node=4", SIGNALS, "my_train.py"]),
    ("no-entrypoint", ["--ntasks=8", "--ntasks-per-node=4", "--cpus-per-task=18"],
     [*APPTAINER, "python", "my_train.py"]),
])
def test_own_script_job_runs_each_form(stubs, form, tasks, command):
    env = base_env(stubs, SCRIPT="my_train.py", FORM=form)  # 2 nodes of 4 GPUs, 72 CPUs
    done = subprocess.run(["bash", str(OWN_SCRIPT), "--steps", "5"], env=env,
                          cwd=stubs.parent, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    [call] = srun_calls(stubs)
    assert call["argv"] == ["--kill-on-bad-exit=1", *tasks, *command, "--steps", "5"]


def test_own_script_job_requeues_on_status_75(stubs):
    done, [call] = launch(stubs, function="launch_script", SCRIPT="my_train.py",
                          STUB_STATUS="75")
    assert done.returncode == 0, done.stderr
    assert other_calls(stubs) == ["scontrol requeue 77"]
    assert call["env"]["TRAIN_REQUEUE_FILE"] == str(stubs.parent / ".train-requeue-77")


@pytest.mark.parametrize(("settings", "message"), [
    ({}, "SCRIPT is not set"),
    ({"SCRIPT": "x.py", "FORM": "mpirun"}, "FORM=mpirun: expected per-task, torchrun or"),
])
def test_own_script_bad_settings_stop_before_srun(stubs, settings, message):
    done, calls = launch(stubs, function="launch_script", **settings)
    assert done.returncode == 2 and message in done.stderr, done.stderr
    assert calls == []


# A jobs/ folder copied out of the image --------------------------------------------------

def test_a_copied_jobs_folder_runs_on_a_host_without_the_package(stubs, tmp_path):
    """`python -m workload.launch jobs DEST` brings jobstep.py along: the batch host's own
    python3 (here /usr/bin's, without this package or its environment) computes the step."""
    dest = tmp_path / "copied" / "jobs"
    subprocess.run([sys.executable, "-m", "workload.launch", "jobs", str(dest)], check=True,
                   capture_output=True, cwd=REPO)
    env = base_env(stubs, JOBS_DIR=str(dest))
    done = subprocess.run(["bash", str(dest / "multinode.sbatch"), "--epochs", "5"], env=env,
                          cwd=stubs.parent, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    [call] = srun_calls(stubs)
    assert call["argv"] == ["--kill-on-bad-exit=1", "--ntasks=8", "--ntasks-per-node=4",
                            "--cpus-per-task=18", *APPTAINER, *TRAIN, "--epochs", "5"]


# Hostile and odd settings: one line naming the setting and the fix, before srun ----------

def one_line(done: subprocess.CompletedProcess) -> str:
    assert done.returncode == 2, done.stderr[-2000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("job: "), done.stderr[-2000:]
    assert len(lines[0]) < 600, "the value is shown shortened"
    return lines[0]


@pytest.mark.parametrize(("settings", "message"), [
    ({"SLURM_NNODES": "abc"}, "SLURM_NNODES=abc: expected a whole number of nodes"),
    ({"SLURM_NNODES": "9" * 5000}, "SLURM_NNODES=999"),
    ({"SLURM_NNODES": "-3"}, "SLURM_NNODES=-3: expected a whole number of nodes"),
    ({"SLURM_NNODES": "0"}, "SLURM_NNODES=0: expected a whole number of nodes"),
    ({"SLURM_CPUS_PER_TASK": "abc"}, "SLURM_CPUS_PER_TASK=abc: expected a whole number of"),
    ({"SLURM_CPUS_PER_TASK": "abc", "LAYOUT": "torchrun"}, "SLURM_CPUS_PER_TASK=abc"),
    ({"GPUS_PER_NODE": "7" * 5000}, "GPUS_PER_NODE=777"),
    # A path in option syntax: a second pyxis mount, docker's -v fields, a runtime option.
    ({"RUNTIME": "pyxis", "DATA_DIR": "/data,/etc"}, "DATA_DIR=/data,/etc: holds ','"),
    ({"RUNTIME": "pyxis", "DATA_DIR": "/data:/x"}, "pyxis's --container-mounts"),
    ({"RUNTIME": "docker", "DATA_DIR": "/a:b"}, "DATA_DIR=/a:b: holds ':', which docker's -v"),
    ({"DATA_DIR": "/a,b"}, "apptainer's --bind reads as a separator"),
    ({"DATA_DIR": "/a\nb"}, "DATA_DIR=/a\\nb: holds a control character"),
    ({"IMAGE": "--writable"}, "IMAGE=--writable: starts with '-'"),
    ({"RUNTIME": "docker", "IMAGE": "-v/:/host"}, "IMAGE=-v/:/host: starts with '-'"),
    ({"RUNTIME": "pyxis", "ENTRYPOINT": "--pty"}, "ENTRYPOINT=--pty: starts with '-'"),
    ({"LAYOUT": "x\x1b[2J"}, "LAYOUT=x\\x1b[2J: expected per-task or torchrun"),
])
def test_hostile_settings_are_one_line_before_srun(stubs, settings, message):
    done, calls = launch(stubs, **settings)
    assert message in one_line(done)
    assert calls == []


@pytest.mark.parametrize(("settings", "message"), [
    ({"SCRIPT": "-c", "FORM": "no-entrypoint"}, "SCRIPT=-c: starts with '-'"),
    ({"SCRIPT": "--nnodes=9", "FORM": "torchrun"}, "SCRIPT=--nnodes=9: starts with '-'"),
    ({"SCRIPT": "x.py", "PYTHON": "-i"}, "PYTHON=-i: starts with '-'"),
])
def test_own_script_settings_that_read_as_options_are_refused(stubs, settings, message):
    done, calls = launch(stubs, function="launch_script", **settings)
    assert message in one_line(done)
    assert calls == []


def test_a_folder_with_a_comma_is_refused_where_it_would_be_mounted(stubs):
    """The job's folder is mounted by docker and pyxis: a ',' there splits the mount."""
    folder = stubs.parent / "a,b"
    folder.mkdir()
    script = f'set -Eeuo pipefail; source "{LAUNCH_SH}"; launch_train'
    done = run_bash(script, base_env(stubs, RUNTIME="pyxis", IMAGE="img.sqsh"), folder)
    assert f"PWD={folder}: holds ','" in one_line(done)
    done = run_bash(script, base_env(stubs), folder)  # apptainer binds it by itself
    assert done.returncode == 0, done.stderr


def test_a_relative_data_dir_is_mounted_at_its_absolute_path(stubs):
    """docker -v takes a relative source for a volume's name, not a folder."""
    done, [call] = launch(stubs, RUNTIME="docker", IMAGE="img", DATA_DIR="mydata")
    assert done.returncode == 0, done.stderr
    data = str(stubs.parent / "mydata")
    assert f"{data}:{data}" in call["argv"]
    assert call["argv"][call["argv"].index("--data-dir") + 1] == data


def test_a_preset_with_a_byte_that_is_not_utf8_is_read(stubs, tmp_path):
    """The shell sources a preset whatever its bytes; its exports are still found."""
    dest = tmp_path / "copied" / "jobs"
    subprocess.run([sys.executable, "-m", "workload.launch", "jobs", str(dest)], check=True,
                   capture_output=True, cwd=REPO)
    (dest / "presets" / "latin1.sh").write_bytes(b"# caf\xe9\nexport NCCL_DEBUG=WARN\n")
    done, [call] = launch(stubs, JOBS_DIR=str(dest), PRESET="latin1")
    assert done.returncode == 0, done.stderr
    assert "preset latin1: NCCL_DEBUG=WARN" in done.stderr
    assert call["env"]["NCCL_DEBUG"] == "WARN"


@pytest.mark.parametrize("preset", ["../lib/requeue", "/etc/profile", "-x", "a b"])
def test_a_preset_is_a_name_in_the_presets_folder_not_a_path(stubs, preset):
    """launch.sh sources presets/$PRESET.sh: a path would source another file."""
    done, calls = launch(stubs, PRESET=preset)
    assert "expected a file name in jobs/presets" in done.stderr, done.stderr
    assert done.returncode == 2 and calls == []


def test_the_next_job_of_a_chain_leaves_the_bad_nodes_behind(stubs):
    answering(stubs, "action=requeue\nnodes=\nexclude=nid002,nid004\n")
    done, _ = launch(stubs, function="launch_train_requeueable", STUB_STATUS="1",
                     CONTINUE="chain")
    assert done.returncode == 0, done.stderr
    [submitted] = [call for call in other_calls(stubs) if call.startswith("sbatch")]
    assert submitted.startswith("sbatch --parsable --exclude=nid002,nid004 --dependency=")
