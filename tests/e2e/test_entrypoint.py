"""entrypoint.sh under `env -i` with stub commands: environment, arguments, PID, signals."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.helpers import REPO
from workload.caches import CACHE_FOLDERS, ROOT_VARIABLE
from workload.launch.__main__ import EXPORTED_KEYS
from workload.launch.diagnostics import flight_recorder_env

ENTRYPOINT = REPO / "entrypoint.sh"
SLURM_ENV = REPO / "tests" / "data" / "slurm_env"
# Variables bash itself adds to the environment of what it execs.
BASH_ADDS = {"PWD", "SHLVL", "_", "OLDPWD"}

# The stub reports what it was started with, then optionally waits for a signal.
STUB = r"""#!{python}
import json, os, signal, sys, time

def on_term(signum, frame):
    os.write(1, b"got SIGTERM\n")
    os._exit(42)
signal.signal(signal.SIGTERM, on_term)
# /proc/self/environ: what exec() passed, before Python adds anything (LC_CTYPE).
raw = open("/proc/self/environ", "rb").read().decode().split("\0")
env = dict(item.split("=", 1) for item in raw if item)
print(json.dumps({{"pid": os.getpid(), "argv": sys.argv[1:], "env": env}}), flush=True)
if sys.argv[1:2] == ["--wait"]:
    time.sleep(60)
"""


@pytest.fixture
def stub_bin(tmp_path: Path) -> Path:
    """A directory with `stub` and `torchrun` stubs, put first on PATH."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("stub", "torchrun", "nvidia_entrypoint"):
        path = bin_dir / name
        path.write_text(STUB.format(python=sys.executable))
        path.chmod(0o755)
    return bin_dir


def clean_env(stub_bin: Path, **extra: str) -> dict[str, str]:
    """What `env -i` leaves plus PATH: the stub dir, this Python's bin, the system; and
    this checkout's package (the commands start outside it, in WORKDIR)."""
    path = f"{stub_bin}:{Path(sys.executable).parent}:/usr/bin:/bin"
    return {"PATH": path, "NVIDIA_ENTRYPOINT": "/nonexistent", "PYTHONPATH": str(REPO),
            **extra}


# Where the commands start: a user's command gets ./diagnostics there (docs/hangs.md).
WORKDIR = Path(tempfile.gettempdir()) / "entrypoint-tests"
# The flight recorder's variables entrypoint.sh exports for a command not of this package.
FLIGHT_RECORDER = flight_recorder_env(WORKDIR / "diagnostics")
# The cache folders it exports for such a command and for torchrun (whose workers may be a
# script that never calls setup()): this user's own under /tmp (the commands start with no
# TMPDIR; workload/caches.py).
OWN_CACHES = Path("/tmp") / f"hpc-train-{os.getuid()}"
CACHES = {**{variable: str(OWN_CACHES / name) for variable, name in CACHE_FOLDERS.items()},
          ROOT_VARIABLE: str(OWN_CACHES)}
FOR_A_SCRIPT = FLIGHT_RECORDER | CACHES


def run(env: dict[str, str], *args: str, **kwargs) -> subprocess.CompletedProcess:
    cmd = ["env", "-i", *(f"{k}={v}" for k, v in env.items()), str(ENTRYPOINT), *args]
    WORKDIR.mkdir(exist_ok=True)
    kwargs.setdefault("cwd", WORKDIR)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, **kwargs)


def report(done: subprocess.CompletedProcess) -> dict:
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[0])


def slurm_env(name: str) -> dict[str, str]:
    lines = (SLURM_ENV / name).read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if line)


def test_echo_hi_passes_through(stub_bin):
    done = run(clean_env(stub_bin), "echo", "hi")
    assert (done.returncode, done.stdout) == (0, "hi\n")


def test_exact_arguments_reach_the_command(stub_bin):
    args = ["--name", "a b", "$HOME", "*", "", "semi;colon", "--x=1"]
    assert report(run(clean_env(stub_bin), "stub", *args))["argv"] == args


def test_exact_environment_outside_slurm(stub_bin):
    env = clean_env(stub_bin)
    got = report(run(env, "stub"))["env"]
    resolved = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1",
                "NODE_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}
    assert {k: v for k, v in got.items() if k not in BASH_ADDS} == env | resolved | FOR_A_SCRIPT


def test_exact_environment_in_a_real_slurm_step(stub_bin):
    # Captured from `srun -N2 -n4` on the test cluster: task 3 on the second node.
    env = clean_env(stub_bin, **slurm_env("step.3.env"))
    got = report(run(env, "stub"))["env"]
    resolved = {"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2",
                "NODE_RANK": "1", "MASTER_ADDR": "nid001", "MASTER_PORT": "20010"}
    assert {k: v for k, v in got.items() if k not in BASH_ADDS} == env | resolved | FOR_A_SCRIPT


def test_torchrun_gets_per_node_values(stub_bin):
    # One task per node: what `srun -N2 --ntasks-per-node=1` sets on the second node.
    env = clean_env(stub_bin, **slurm_env("step.1.env") | {
        "SLURM_STEP_TASKS_PER_NODE": "1(x2)", "SLURM_STEP_NUM_TASKS": "2",
        "SLURM_LOCALID": "0", "SLURM_PROCID": "1", "SLURM_NODEID": "1"})
    got = report(run(env, "torchrun", "--nproc-per-node=2"))
    added = {k: v for k, v in got["env"].items() if k not in env and k not in BASH_ADDS}
    assert added == {"NODE_RANK": "1", "MASTER_ADDR": "nid001", "MASTER_PORT": "20010",
                     "PET_NNODES": "2", "PET_NODE_RANK": "1", "PET_MASTER_ADDR": "nid001",
                     "PET_MASTER_PORT": "20010",
                     # Elastic restarts: a c10d rendezvous on the first node and a fresh
                     # store per round (see workload/launch/resolve.py).
                     "PET_RDZV_BACKEND": "c10d", "PET_RDZV_ENDPOINT": "nid001:20010",
                     "PET_RDZV_ID": "slurm-1-0", "PET_RDZV_CONF": "is_host=0",
                     "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1", **CACHES}
    assert got["argv"] == ["--nproc-per-node=2"]


def test_torchrun_outside_slurm_gets_a_fresh_store_per_restart(stub_bin):
    got = report(run(clean_env(stub_bin), "torchrun", "--standalone"))
    added = {k: v for k, v in got["env"].items()
             if k not in clean_env(stub_bin) and k not in BASH_ADDS}
    assert added == {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1", **CACHES}
    # The user's own choice is kept.
    got = report(run(clean_env(stub_bin, TORCH_DISABLE_SHARE_RDZV_TCP_STORE="0"), "torchrun"))
    assert got["env"]["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "0"


def test_double_dash_ends_the_entrypoint_options(stub_bin):
    done = run(clean_env(stub_bin), "--", "echo", "hi")
    assert (done.returncode, done.stdout) == (0, "hi\n")
    assert report(run(clean_env(stub_bin), "--", "stub", "--", "-x"))["argv"] == ["--", "-x"]


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_help_prints_the_usage(stub_bin, flag):
    done = run(clean_env(stub_bin), flag)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("Usage: entrypoint.sh [--] COMMAND [ARGS...]")
    assert "entrypoint.sh echo hi" in done.stdout


def test_unknown_option_exits_2_naming_the_fix(stub_bin, tmp_path):
    done = run(clean_env(stub_bin), "--frobnicate", "echo", "hi")
    assert done.returncode == 2 and done.stdout == ""
    assert "--frobnicate" in done.stderr and "put --" in done.stderr


def test_user_values_are_kept(stub_bin):
    env = clean_env(stub_bin, **slurm_env("step.0.env"), MASTER_PORT="23456")
    got = report(run(env, "stub"))["env"]
    assert got["MASTER_PORT"] == "23456"


def test_command_keeps_the_entrypoint_pid(stub_bin):
    proc = subprocess.Popen(["env", "-i", *(f"{k}={v}" for k, v in clean_env(stub_bin).items()),
                             str(ENTRYPOINT), "stub"], stdout=subprocess.PIPE, text=True)
    out, _ = proc.communicate(timeout=60)
    # `env -i` execs the entrypoint, which execs the stub: one PID all the way.
    assert json.loads(out.splitlines()[0])["pid"] == proc.pid


def test_signal_reaches_the_command(stub_bin):
    argv = ["env", "-i", *(f"{k}={v}" for k, v in clean_env(stub_bin).items()),
            str(ENTRYPOINT), "stub", "--wait"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    json.loads(proc.stdout.readline())  # the stub is running and has its handler
    proc.send_signal(signal.SIGTERM)
    rest = proc.stdout.read()
    assert proc.wait(timeout=30) == 42
    assert "got SIGTERM" in rest


def test_bad_value_exits_2_and_starts_nothing(stub_bin, tmp_path):
    marker = tmp_path / "started"
    done = run(clean_env(stub_bin, RANK="one"), "touch", str(marker))
    assert done.returncode == 2
    assert "RANK='one'" in done.stderr
    assert not marker.exists()


def test_no_command_is_a_usage_error(stub_bin):
    done = run(clean_env(stub_bin))
    assert done.returncode == 2 and "usage: entrypoint.sh COMMAND" in done.stderr


def test_chains_to_the_nvidia_entrypoint(stub_bin):
    env = clean_env(stub_bin) | {"NVIDIA_ENTRYPOINT": str(stub_bin / "nvidia_entrypoint")}
    got = report(run(env, "echo", "hi"))
    assert got["argv"] == ["echo", "hi"]
    assert got["env"]["WORLD_SIZE"] == "1"


def test_sourcing_defines_functions_without_running(stub_bin):
    script = f"source {ENTRYPOINT} && declare -F main err export_lines && echo sourced"
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True,
                          env=clean_env(stub_bin), timeout=30)
    assert done.returncode == 0 and done.stdout.splitlines()[-1] == "sourced"


def test_one_gpu_per_task_exports_local_gpu_and_warns_about_local_rank(stub_bin):
    # srun --gpus-per-task=1: SLURM narrows CUDA_VISIBLE_DEVICES to the task's GPU.
    env = clean_env(stub_bin, **slurm_env("step.3.env"), CUDA_VISIBLE_DEVICES="1")
    done = run(env, "stub")
    seen = report(done)["env"]
    assert (seen["LOCAL_RANK"], seen["LOCAL_GPU"]) == ("1", "0")
    assert "LOCAL_RANK=1 cannot index the 1 GPU(s)" in done.stderr
    assert "LOCAL_GPU=0" in done.stderr


def test_a_newline_in_the_folder_name_runs_no_other_program(stub_bin, tmp_path):
    """A folder named "a<newline>PATH=" with the path of another folder below it: the
    flight recorder's prefix, <cwd>/diagnostics/fr-rank-, printed as it was, became a
    second line PATH=<that folder>/diagnostics/fr-rank-, and the command was looked up
    there. The resolver refuses the control character and nothing starts."""
    evil = tmp_path / "evil"
    planted = evil / "diagnostics" / "fr-rank-"
    planted.mkdir(parents=True)
    ran = tmp_path / "planted-program-ran"
    (planted / "stub").write_text(f"#!/bin/sh\necho planted >{ran}\n")  # PATH is gone
    (planted / "stub").chmod(0o755)
    workdir = Path(f"{tmp_path / 'a'}\nPATH={evil}")
    workdir.mkdir(parents=True)
    done = run(clean_env(stub_bin), "stub", cwd=workdir)
    assert not ran.exists(), "the planted program ran"
    assert done.returncode == 2, done.stdout
    assert "TORCH_FR_DUMP_TEMP_FILE=" in done.stderr and "control characters" in done.stderr


def test_only_the_resolvers_variables_are_exported(stub_bin):
    """A line for another name (PATH here) cannot come from the resolver: refused."""
    script = (f"source {ENTRYPOINT}; export_lines <<<$'RANK=0\\nPATH=/elsewhere'; "
              "echo exported")
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True,
                          env=clean_env(stub_bin), timeout=30)
    assert done.returncode == 2 and "exported" not in done.stdout
    assert "unexpected line from the resolver: PATH=/elsewhere" in done.stderr


def test_the_exported_names_are_the_resolvers_own(stub_bin):
    """entrypoint.sh's list and the one `python -m workload.launch env` prints from."""
    script = f'source {ENTRYPOINT}; printf "%s\\n" "${{EXPORTED_KEYS[@]}}"'
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True,
                          env=clean_env(stub_bin), timeout=30)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == list(EXPORTED_KEYS)
