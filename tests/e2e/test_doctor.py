"""`doctor` on one CPU process: the real command, real mounts, its JSON and exit status."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from workload.caches import CACHE_KEYS
import torch

from tests.helpers import DOCTOR_FAST as FAST
from tests.helpers import by_check, clean_env, tmpfs
from workload.doctor.findings import cpu_ranges



def doctor(args, tmp_path, env=None, cmd=("-m", "workload.doctor")):
    """Run the doctor as users do; return (exit status, stdout, stderr, JSON or None)."""
    report = tmp_path / "doctor.json"
    clean = {k: v for k, v in clean_env().items() if k != "NVIDIA_TF32_OVERRIDE"}
    done = subprocess.run([sys.executable, *cmd, "--json", str(report), "--output-dir",
                           str(tmp_path / "runs"), *FAST, *args], capture_output=True,
                          text=True, env={**clean, **(env or {})}, cwd=tmp_path, timeout=300)
    data = json.loads(report.read_text()) if report.exists() else None
    return done.returncode, done.stdout, done.stderr, data


def test_one_cpu_process_is_ready_and_writes_the_same_as_json(tmp_path):
    status, out, err, data = doctor(["--device", "cpu"], tmp_path)
    assert status == 0, out + err
    assert data["world_size"] == 1 and data["status"] in ("ok", "warn")
    assert [r["rank"] for r in data["ranks"]] == [0]
    assert data["ranks"][0]["device"] == "cpu"
    assert data["ranks"][0]["cpus"] == cpu_ranges(os.sched_getaffinity(0))
    matmul, = by_check(data, "matmul")
    assert matmul["status"] == "ok" and "cpu" in matmul["detail"]
    assert {"torch", "python"} <= data["versions"][0].keys()
    assert {f["check"] for f in data["findings"]} >= {
        "gpu", "matmul", "shm", "dali", "tf32", "threads", "output-dir", "cache"}
    # The printed report says the same things: the table, every check, the verdict.
    assert "rank  node" in out and "matmul" in out and "doctor: ready" in out
    assert not (tmp_path / "runs").exists()  # checking a folder does not create it
    # No GPU here: the NVML checks say in one line that they did not run, and pass.
    nvml, = by_check(data, "gpu-health")
    assert nvml["status"] == "info" and "this rank runs on the CPU" in nvml["detail"]
    assert out.count("NVML checks (clocks, temperature, ECC) did not run") == 1
    assert data["gpus"] == ["this rank runs on the CPU"]


@pytest.mark.root
def test_small_shm_warns_with_the_container_fix(tmp_path):
    with tmpfs(tmp_path / "shm", "size=64m") as shm:  # Docker's default /dev/shm
        status, out, err, data = doctor(["--device", "cpu", "--shm-path", str(shm)], tmp_path)
    assert status == 0, out + err  # a warning, not a failure
    shm_finding, = by_check(data, "shm")
    assert shm_finding["status"] == "warn" and "64.0 MiB" in shm_finding["detail"]
    assert "--shm-size" in shm_finding["fix"] and "--ipc=host" in shm_finding["fix"]
    assert "--shm-size" in out


@pytest.mark.root
def test_large_shm_is_fine_until_the_data_loaders_need_more(tmp_path):
    """1,100 MiB (above the 1 GiB rule) holds the loaders of CIFAR-sized batches; 1,024
    images of 224 px (588 MiB a batch, two ready per worker, at least one worker) do not
    fit."""
    with tmpfs(tmp_path / "shm", "size=1100m") as shm:
        _, _, _, small = doctor(["--device", "cpu", "--shm-path", str(shm)], tmp_path)
        _, _, _, large = doctor(["--device", "cpu", "--shm-path", str(shm), "--batch-size",
                                 "1024", "--image-size", "224"], tmp_path)
    fine, = by_check(small, "shm")
    assert fine["status"] == "ok" and "the data loaders need about" in fine["detail"]
    assert "at --batch-size 256, 32 px" in fine["detail"]
    short, = by_check(large, "shm")
    assert short["status"] == "warn" and "more than is free" in short["detail"]
    assert "batches of 588.0 MiB at --batch-size 1024, 224 px" in short["detail"]
    assert "--shm-size" in short["fix"] and "--workers" in short["fix"]


@pytest.mark.root
def test_read_only_output_dir_is_fatal_and_names_the_fix(tmp_path):
    with tmpfs(tmp_path / "ro", "ro,size=1m") as read_only:
        status, out, err, data = doctor(["--device", "cpu", "--output-dir",
                                         str(read_only / "runs")], tmp_path)
    assert status == 1, out + err
    finding, = by_check(data, "output-dir")
    assert finding["status"] == "fail" and "Read-only file system" in finding["detail"]
    assert "--output-dir" in finding["fix"]
    assert "NOT READY" in out and "output-dir" in out.splitlines()[-1]


def test_oversubscribed_threads_and_tf32_override_warn(tmp_path):
    cpus = len(os.sched_getaffinity(0))
    _, _, _, data = doctor(["--device", "cpu"], tmp_path,
                           env={"OMP_NUM_THREADS": str(4 * cpus), "NVIDIA_TF32_OVERRIDE": "0"})
    threads, = by_check(data, "threads")
    assert threads["status"] == "warn" and f"OMP_NUM_THREADS={cpus}" in threads["fix"]
    tf32, = by_check(data, "tf32")
    assert tf32["status"] == "warn" and "NVIDIA_TF32_OVERRIDE" in tf32["fix"]


def test_unwritable_caches_name_the_variable_to_set(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    # Triton's cache matters only when compiling: a warning. torch creates the inductor
    # cache folder when torchvision is imported, so train would stop at once: a failure.
    status, out, err, data = doctor(["--device", "cpu"], tmp_path, env={
        "TRITON_CACHE_DIR": str(blocker / "triton"),
        "TORCHINDUCTOR_CACHE_DIR": str(blocker / "inductor")})
    assert status == 1 and "Traceback" not in err, err
    bad = {f["status"]: f for f in by_check(data, "cache") if f["status"] != "ok"}
    assert "export TRITON_CACHE_DIR=" in bad["warn"]["fix"]
    assert "export TORCHINDUCTOR_CACHE_DIR=" in bad["fail"]["fix"]


@pytest.mark.root
def test_a_noexec_temp_folder_and_a_read_only_home_warn_with_their_fixes(tmp_path):
    """Triton and Inductor load the kernels they compile from the temp folder and the
    caches chosen under it: a noexec mount breaks --compile; a read-only home breaks
    programs that write ~/.cache (hpc-train writes nothing there)."""
    with tmpfs(tmp_path / "tmp", "noexec") as tmp, tmpfs(tmp_path / "home", "ro") as home:
        status, out, err, data = doctor(["--device", "cpu"], tmp_path,
                                        env={"TMPDIR": str(tmp), "HOME": str(home),
                                             # not the folders this worker's process chose
                                             **{key: "" for key in CACHE_KEYS}})
    assert status == 0, out + err  # warnings: a run without --compile still works
    temp, = by_check(data, "temp")
    assert temp["status"] == "warn" and "noexec" in temp["detail"]
    assert temp["fix"].startswith("export TMPDIR=")
    home_finding, = by_check(data, "home")
    assert home_finding["status"] == "warn" and "not writable" in home_finding["detail"]
    assert "--home" in home_finding["fix"]
    storage = {f["detail"].split()[0]: f for f in by_check(data, "cache-storage")}
    assert storage.keys() == {"TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"}
    for variable, finding in storage.items():
        assert finding["status"] == "warn" and "noexec" in finding["detail"], finding
        assert finding["fix"].startswith(f"export {variable}=")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without GPU")
def test_device_cuda_without_a_gpu_is_fatal_with_the_fix(tmp_path):
    status, out, _, data = doctor(["--device", "cuda"], tmp_path)
    assert status == 1
    gpu, = by_check(data, "gpu")
    assert gpu["status"] == "fail" and "--device cpu" in gpu["fix"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_every_gpu_passes_the_matmul_check(tmp_path):
    status, out, err, data = doctor(["--device", "cuda"], tmp_path)
    assert status == 0, out + err
    assert len(by_check(data, "matmul")) == torch.cuda.device_count()


@pytest.mark.parametrize("args, words", [
    (["--probe-iters", "0"], ["--probe-iters", "1 or more", "got 0"]),
    (["--timeout", "-5"], ["--timeout", "-5.0", "--timeout 120"]),
    (["--probe-mib", "-1"], ["--probe-mib", "got -1"]),
    (["--pair-rounds", "0"], ["--pair-rounds", "got '0'", "`all`", "--pair-max-mib 0"]),
    # inf doubled a size until memory ran out; nan passed `< 0` and skipped the sweep
    (["--sweep-max-mib", "inf"], ["--sweep-max-mib", "'inf' is not a finite number"]),
    (["--pair-max-mib", "nan"], ["--pair-max-mib", "'nan' is not a finite number"]),
    (["--timeout", "nan"], ["--timeout", "'nan' is not a finite number"]),
    (["--sweep-max-mib", "1e300"], ["--sweep-max-mib", "to 65536", "got 1e+300"]),
    (["--probe-mib", "1e9"], ["--probe-mib", "to 65536"]),
])
def test_bad_flags_exit_2_with_one_line_before_any_check(args, words, tmp_path):
    status, out, err, data = doctor(args, tmp_path)
    assert status == 2 and out == "" and data is None
    errors = [line for line in err.splitlines() if "error:" in line]  # argparse: usage too
    assert len(errors) == 1 and errors[0].startswith("doctor: error:"), err
    err = errors[0]
    for word in words:
        assert word in err


def test_json_into_a_folder_that_cannot_exist_exits_2(tmp_path):
    (tmp_path / "a-file").write_text("x")
    done = subprocess.run([sys.executable, "-m", "workload.doctor", "--json",
                           str(tmp_path / "a-file" / "d.json")], capture_output=True, text=True)
    assert done.returncode == 2 and "--json" in done.stderr and "a-file" in done.stderr


@pytest.mark.parametrize("kind", ["folder", "fifo"])
def test_json_that_cannot_be_a_file_exits_2_before_any_check(kind, tmp_path):
    target = tmp_path / "out.json"
    target.mkdir() if kind == "folder" else os.mkfifo(target)
    done = subprocess.run([sys.executable, "-m", "workload.doctor", "--json", str(target)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stdout == "", done.stdout + done.stderr
    assert done.stderr.count("\n") == 1 and f"--json {target}" in done.stderr


def test_shm_path_naming_a_regular_file_is_a_warning_not_ok(tmp_path):
    (tmp_path / "shm-file").write_text("")
    _, out, _, data = doctor(["--device", "cpu", "--shm-path", str(tmp_path / "shm-file")],
                             tmp_path)
    shm, = by_check(data, "shm")
    assert shm["status"] == "warn" and "not a folder" in shm["detail"], shm
