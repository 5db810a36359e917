"""A run's energy, on two gloo ranks, with a stand-in NVML (tests/scripts/nvml_stand_in)
whose scripted counter each rank reads as its GPU's: the sum over the ranks, the
per-interval values in steps.jsonl, "unavailable" (never 0) without a counter, a counter
that goes backwards or stops answering said once without failing the run, and the total
of a run killed, then preempted, then finished: three jobs, each resuming the one before
(a kill loses only what came after the last checkpoint, a preemption nothing; a fourth job,
a preempted one first, would add two `train` processes and no assertion of its own)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import TESTS, TINY, clean_env, free_ports, local_rank_env, read_jsonl
from workload.checkpoint.formats import read_part

pytestmark = pytest.mark.slow

STAND_IN = TESTS / "scripts" / "nvml_stand_in"
# 4 steps per epoch and rank (128 images, 16 per rank and step), an exchange every 2.
ARGS = [*TINY, "--dataset", "synthetic", "--synthetic-size", "128", "--image-size", "16",
        "--num-classes", "4", "--batch-size", "16", "--seed", "9", "--precision", "fp32",
        "--log-every", "2", "--dist-start-timeout", "120", "--dist-timeout", "120"]
STEADY = {"0": {"mode": "steady", "mj": 1000}, "1": {"mode": "steady", "mj": 3000}}


def start(out: Path, script: dict, log: Path, *extra: str) -> list[subprocess.Popen]:
    """Two ranks started by hand, each reading the stand-in's GPU LOCAL_RANK."""
    log.mkdir(parents=True, exist_ok=True)
    (log / "script.json").write_text(json.dumps(script))
    port = free_ports(1)[0]
    procs = []
    for rank in (0, 1):
        env = {**local_rank_env(rank, 2, port), "PYTHONPATH": f"{STAND_IN}:{TESTS.parent}",
               "HPC_TRAIN_NVML_STAND_IN": "1", "NVML_STAND_IN_LOG": str(log),
               "NVML_STAND_IN_SCRIPT": str(log / "script.json")}
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "workload.train", *ARGS, *extra, "--output-dir", str(out)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env))
    return procs


def finish(procs: list[subprocess.Popen], codes=(0, 0)) -> str:
    logs = [p.communicate(timeout=300)[0] for p in procs]
    assert tuple(p.returncode for p in procs) == codes, "\n".join(logs)[-6000:]
    return "\n".join(logs)


def told(log: Path) -> dict[str, list[int]]:
    """What the stand-in returned, per process and GPU, in order (millijoules)."""
    return {p.stem: [int(v) for v in p.read_text().split()] for p in log.glob("*-*.txt")}


def counted_j(log: Path, backwards_at: int | None = None) -> float:
    """The energy in joules the readings add up to, over every process: the differences
    between readings, and after a restart of the counter its new value."""
    total = 0
    for values in told(log).values():
        total += sum(b - a if b >= a else b for a, b in zip(values, values[1:]))
    return total / 1000


@pytest.fixture(scope="module")
def steady_run(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("steady")
    out, log = root / "run", root / "nvml"
    text = finish(start(out, STEADY, log, "--epochs", "2", "--checkpoint-every", "2"))
    return dict(out=out, log=log, text=text,
                summary=json.loads((out / "summary.json").read_text()),
                steps=read_jsonl(out / "steps.jsonl"))


def test_the_total_is_every_ranks_counter_summed(steady_run):
    s, log = steady_run["summary"], steady_run["log"]
    assert len(told(log)) == 2, "one process per rank read its GPU"
    assert s["gpu_energy_source"] == "nvml-total-energy"
    assert s["gpu_energy_j"] == pytest.approx(counted_j(log))
    assert s["gpu_energy_kwh"] == pytest.approx(s["gpu_energy_j"] / 3.6e6)
    assert s["gpu_energy_per_step_j"] == pytest.approx(s["gpu_energy_j"] / s["steps_run"])
    assert s["gpu_energy_per_image_j"] == pytest.approx(s["gpu_energy_j"] / (8 * 2 * 16))
    assert s["energy_jobs"] == 1 and "last checkpoint" in s["energy_not_counted"]
    assert f"GPU boards {s['gpu_energy_kwh']:.4g} kWh; summary in" in steady_run["text"]
    # The CPU packages are a field of their own, and this machine's RAPL is not readable
    # or absent in the test's container: unavailable, never 0.
    if s["cpu_package_energy_j"] is None:
        assert s["cpu_package_energy_source"].startswith("unavailable: ")


def test_steps_jsonl_has_each_intervals_energy_and_power(steady_run):
    lines, s = steady_run["steps"], steady_run["summary"]
    assert [line["step"] for line in lines] == [2, 4, 6, 8]
    # Rank 0's counter moves 1 J and rank 1's 3 J per reading; each rank reads once per
    # exchange and once per checkpoint: an interval is a whole number of 4 J rounds, and
    # the running total moves by it.
    for before, line in zip(lines, lines[1:]):
        assert line["gpu_energy_j"] > 0 and line["gpu_energy_j"] % 4 == 0, line
        assert line["gpu_energy_total_j"] - before["gpu_energy_total_j"] == pytest.approx(
            line["gpu_energy_j"])
        assert line["gpu_power_w"] > 0
    assert lines[-1]["gpu_energy_total_j"] <= s["gpu_energy_j"]


def test_a_counter_that_goes_backwards_is_counted_on_and_said_once(tmp_path):
    script = {"0": {"mode": "backwards", "mj": 1000, "after": 3},
              "1": {"mode": "backwards", "mj": 3000, "after": 5}}
    out, log = tmp_path / "run", tmp_path / "nvml"
    text = finish(start(out, script, log, "--epochs", "2", "--checkpoint-every", "0"))
    summary = json.loads((out / "summary.json").read_text())
    assert summary["gpu_energy_j"] == pytest.approx(counted_j(log))
    assert text.count("went backwards") == 2, text  # once per rank, each its own GPU
    assert "train[rank 1]: energy: " in text


def test_no_counter_is_unavailable_never_zero_and_a_lost_gpu_is_said_once(tmp_path):
    script = {"0": {"mode": "fails", "mj": 1000, "after": 3},
              "1": {"mode": "not_supported"}}
    out, log = tmp_path / "run", tmp_path / "nvml"
    text = finish(start(out, script, log, "--epochs", "2", "--checkpoint-every", "2"))
    summary = json.loads((out / "summary.json").read_text())
    for key in ("gpu_energy_j", "gpu_energy_kwh", "gpu_energy_per_image_j",
                "gpu_energy_per_step_j"):
        assert summary[key] is None, key
    assert summary["gpu_energy_source"].startswith("unavailable: rank 0: ")
    assert "stopped answering (GPU is lost)" in summary["gpu_energy_source"]
    assert text.count("stopped answering") == 1, text
    assert summary["gpu_energy_source"].endswith(
        "; rank 1: the GPU's energy counter cannot be read (Not Supported)")
    for line in read_jsonl(out / "steps.jsonl"):
        assert line["gpu_energy_j"] is None and line["gpu_energy_total_j"] is None, line


@pytest.mark.root  # a mount namespace: a stand-in /sys/class/powercap for train alone
def test_a_rapl_counter_that_is_no_number_leaves_the_cpu_figure_out_and_trains(tmp_path):
    zone = tmp_path / "class" / "powercap" / "intel-rapl:0"
    zone.mkdir(parents=True)
    for name, text in (("name", "package-0"), ("energy_uj", "garbage"),
                       ("max_energy_range_uj", "262143328850")):
        (zone / name).write_text(text + "\n")
    train = Path(sys.executable).with_name("train")
    bind = 'mount --bind "$1" /sys/class && shift && exec "$@"'
    done = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", bind, "sh",
         str(tmp_path / "class"), str(train), *ARGS, "--epochs", "1",
         "--output-dir", str(tmp_path / "run")],
        env={**clean_env(), "OMP_NUM_THREADS": "1"}, capture_output=True, text=True,
        timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    said = [line for line in (done.stdout + done.stderr).splitlines() if "RAPL" in line]
    assert said == ["train: energy: the node's CPU package energy (RAPL) is not counted: "
                    "/sys/class/powercap/intel-rapl:0/energy_uj holds 'garbage\\n', not a "
                    "whole number of microjoules"], done.stdout + done.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["cpu_package_energy_j"] is None
    assert summary["cpu_package_energy_source"].startswith(
        "unavailable: RAPL cannot be read (/sys/class/powercap/intel-rapl:0/energy_uj holds")


def trainer_energy(out: Path, step: int) -> dict:
    return read_part(out / "checkpoints" / f"step-{step:09d}", "trainer")["energy"]


def resumed_at(text: str) -> int:
    line = next(line for line in text.splitlines() if "resumed from" in line)
    return int(line.split("step-")[1][:9])


def preempted_job(out: Path, log: Path) -> tuple[str, int]:
    procs = start(out, STEADY, log, *CHAIN)
    lines = []
    for line in procs[0].stdout:
        lines.append(line)
        if "data backend" in line:
            procs[0].send_signal(signal.SIGUSR2)
            break
    text = "".join(lines) + finish(procs, codes=(75, 75))
    step = int(text.split("preempted by SIGUSR2 at step ")[1].split(":")[0])
    return text, step


def killed_job(out: Path, log: Path) -> str:
    """Both ranks SIGKILLed once the run's first checkpoint is complete."""
    procs = start(out, STEADY, log, *CHAIN)
    latest, deadline = out / "checkpoints" / "latest", time.monotonic() + 240
    while time.monotonic() < deadline:
        if latest.is_file() and latest.read_text().strip():
            break
        time.sleep(0.05)
    for p in procs:
        p.kill()
    return finish(procs, codes=(-9, -9))


CHAIN = ["--epochs", "6", "--checkpoint-every", "2"]


def test_killed_preempted_and_finished_the_total_holds_every_job(tmp_path):
    out = tmp_path / "run"
    logs = [tmp_path / f"nvml-{job}" for job in range(3)]
    text = killed_job(out, logs[0])
    text2, step2 = preempted_job(out, logs[1])
    first = trainer_energy(out, resumed_at(text2))  # job 1 up to its last checkpoint: the
    assert 0 < first["gpu_j"] <= counted_j(logs[0]) and first["jobs"] == 1  # rest is lost
    second = trainer_energy(out, step2)  # a preemption saves at the stop: nothing lost
    assert second["gpu_j"] == pytest.approx(first["gpu_j"] + counted_j(logs[1]))
    assert second["jobs"] == 2
    final = finish(start(out, STEADY, logs[2], *CHAIN))
    summary = json.loads((out / "summary.json").read_text())
    assert summary["energy_jobs"] == 3, final
    assert summary["gpu_energy_j"] == pytest.approx(
        second["gpu_j"] + counted_j(logs[2])), text
