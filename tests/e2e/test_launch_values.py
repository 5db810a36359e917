"""Hostile launch variables, given to the commands users run as they run them: one line
naming the variable and what was expected, exit status 2, never a traceback. Numbers past
Python's int-string limit (4300 digits) were a ValueError traceback in all of them."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.helpers import TINY, clean_env

HUGE = "7" * 5000
STEP = {"SLURM_JOB_ID": "5", "SLURM_STEP_ID": "0"}
CASES = [
    # (case id, environment, the variable the line must name)
    ("rank", {"RANK": HUGE, "WORLD_SIZE": "2"}, "RANK"),
    ("master-port", {"MASTER_PORT": HUGE}, "MASTER_PORT"),
    ("job-id", {"SLURM_JOB_ID": HUGE}, "SLURM_JOB_ID"),
    ("procid", STEP | {"SLURM_PROCID": HUGE}, "SLURM_PROCID"),
    ("cpus-per-task", STEP | {"SLURM_CPUS_PER_TASK": HUGE}, "SLURM_CPUS_PER_TASK"),
    ("local-gpu", {"LOCAL_GPU": HUGE}, "LOCAL_GPU"),
    ("node-list-range", STEP | {"SLURM_STEP_NODELIST": f"nid[1-{HUGE}]"}, "SLURM_STEP_NODELIST"),
    ("tasks-per-node", STEP | {"SLURM_STEP_TASKS_PER_NODE": f"{HUGE}(x2)"},
     "SLURM_STEP_TASKS_PER_NODE"),
]
IDS = [case[0] for case in CASES]


def one_line_refusal(done: subprocess.CompletedProcess, name: str) -> str:
    assert done.returncode == 2, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr[-2000:]
    assert f"{name}=" in lines[0] and "expected" in lines[0] and "fix:" in lines[0], lines[0]
    assert len(lines[0]) < 600, "the line quotes the value shortened, not 5000 digits"
    return lines[0]


@pytest.mark.parametrize("action", ["env", "check"])
@pytest.mark.parametrize("env,name", [case[1:] for case in CASES], ids=IDS)
def test_launch_env_and_check_refuse_in_one_line(action, env, name):
    done = subprocess.run([sys.executable, "-m", "workload.launch", action],
                          env=clean_env() | env, capture_output=True, text=True, timeout=60)
    assert done.stdout == ""
    one_line_refusal(done, name)


def test_a_huge_number_names_the_digit_limit():
    done = subprocess.run([sys.executable, "-m", "workload.launch", "env"],
                          env=clean_env() | {"RANK": HUGE}, capture_output=True, text=True,
                          timeout=60)
    assert "a whole number" in one_line_refusal(done, "RANK")


@pytest.mark.parametrize("env,name", [CASES[0][1:], CASES[3][1:]], ids=[IDS[0], IDS[3]])
def test_train_refuses_in_one_line_before_any_work(tmp_path, env, name):
    done = subprocess.run([sys.executable, "-m", "workload.train", *TINY, "--dataset",
                           "synthetic", "--output-dir", str(tmp_path / "run")],
                          env=clean_env() | env, capture_output=True, text=True, timeout=300)
    one_line_refusal(done, name)
    assert not (tmp_path / "run").exists() or not any((tmp_path / "run").iterdir())
