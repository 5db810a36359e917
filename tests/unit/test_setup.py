"""workload.launch.setup(), the first call of a user's own script: the launch table (the
same expectations as `python -m workload.launch env`), torchrun's values kept, a single
process, the GPU it selects (LOCAL_GPU, the LOCAL_RANK pitfall), the torch-free
preemption helper, and `python -m workload.launch jobs`."""

from __future__ import annotations

import faulthandler
import os
import signal
from pathlib import Path
from unittest import mock

import pytest

from tests.helpers import REPO
from tests.helpers.launch_table import CPU_SHARES, CPUS, GOOD, TORCHRUN_WORKER, step
from workload.launch import (REQUEUE_EXIT_STATUS, Launch, LaunchError, PreemptionFlag,
                             exit_for_requeue, setup)
from workload.launch import script
from workload.launch.__main__ import main
from workload.held import is_held, let_go

# The worker cases of the table (the others describe a torchrun about to start).
WORKER_CASES = [case for case in GOOD if not case[2]]


class FakeCuda:
    """What setup() sees of torch.cuda: `count` GPUs; records the device it selects."""

    def __init__(self, count: int):
        self.selected: list[int] = []
        self.cuda = script._Cuda(count, self.selected.append, None)


def run_setup(env: dict[str, str], cuda=None, **kwargs) -> tuple[Launch, dict[str, str]]:
    env = dict(env)
    with mock.patch("workload.launch.resolve.usable_cpus", return_value=CPUS), \
            mock.patch.object(script, "_cuda", return_value=cuda):
        launch = setup(env, **kwargs)
    return launch, env


@pytest.mark.parametrize("env,args,expected,layout", [c[1:] for c in WORKER_CASES],
                         ids=[c[0] for c in WORKER_CASES])
def test_setup_follows_the_launch_table(env, args, expected, layout):
    launch, exported = run_setup(env | {"CUDA_VISIBLE_DEVICES": ""}, quiet=True)
    assert {key: exported.get(key) for key in expected} == expected
    assert launch.layout == layout and launch.device == "cpu"
    assert (launch.rank, launch.local_rank, launch.world_size, launch.local_world_size,
            launch.node_rank) == tuple(int(exported[key]) for key in (
                "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "NODE_RANK"))


def test_a_single_process_gets_what_init_process_group_reads():
    launch, exported = run_setup({})
    assert launch == Launch(0, 0, 1, 1, 0, "cpu", None, "single", CPUS)
    assert {key: exported[key] for key in ("RANK", "WORLD_SIZE", "MASTER_ADDR",
                                           "MASTER_PORT")} == {
        "RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}
    assert launch.is_main and launch.backend == "gloo"


def test_setup_points_the_caches_at_this_users_own_folder(tmp_path):
    """Before torch is imported (a shared /tmp's fixed folder would be the first user's)."""
    own = tmp_path / f"hpc-train-{os.getuid()}"
    _, exported = run_setup({"TMPDIR": str(tmp_path), "TRITON_CACHE_DIR": "/mine/triton"})
    assert exported["TORCHINDUCTOR_CACHE_DIR"] == str(own / "inductor") and own.is_dir()
    assert exported["TRITON_CACHE_DIR"] == "/mine/triton", "the user's own value wins"


def test_torchruns_values_are_kept_without_a_warning(capsys):
    env = step(per_node="1(x2)", ntasks="2", procid="1", nodeid="1") | TORCHRUN_WORKER
    launch, exported = run_setup(env)
    assert (launch.rank, launch.local_rank, launch.world_size, launch.layout) == \
        (5, 1, 8, "torchrun-per-node")
    assert {key: exported[key] for key in TORCHRUN_WORKER} == TORCHRUN_WORKER
    assert capsys.readouterr().err == ""


def test_a_users_value_is_never_overwritten(capsys):
    env = step(procid="1") | {"RANK": "3", "MASTER_PORT": "4242"}
    launch, exported = run_setup(env)
    assert (launch.rank, exported["RANK"], exported["MASTER_PORT"]) == (3, "3", "4242")
    assert "RANK=3 is already set and kept" in capsys.readouterr().err


def test_a_bad_value_raises_naming_it():
    with pytest.raises(LaunchError, match="SLURM_PROCID='zero'.*fix:"):
        run_setup(step(procid="zero"))


def held_setup(env: dict[str, str]) -> tuple[Launch, Path]:
    """setup() in this process with `env` as its whole environment: its Launch and the
    folder its flight recorder prefix names (held: the descriptor closed afterwards)."""
    with mock.patch.dict(os.environ, env, clear=True):
        try:
            launch = setup(quiet=True)
        finally:
            faulthandler.unregister(signal.SIGUSR1)  # the dump is this test's, not pytest's
        assert (os.environ["RANK"], os.environ["WORLD_SIZE"]) == ("2", "4")
        prefix = Path(os.environ["TORCH_FR_DUMP_TEMP_FILE"])
    assert prefix.name == "fr-rank-" and is_held(prefix.parent), prefix
    folder = Path(os.readlink(prefix.parent))
    let_go(prefix.parent)
    return launch, folder


def test_setup_really_applies_to_os_environ(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # its ./diagnostics: the flight recorder's and SIGUSR1's
    launch, folder = held_setup(step(procid="2", localid="0", nodeid="1"))
    assert folder == tmp_path / "diagnostics"
    assert launch.node_rank == 1
    assert (tmp_path / "diagnostics" / "rank-2.txt").exists()


def test_the_flight_recorder_writes_through_the_held_diagnostics_folder(tmp_path,
                                                                       monkeypatch):
    """Issue 59 §2: torch opens prefix+rank by name, following a link. The prefix
    `python -m workload.launch env` printed (./diagnostics by its name) becomes the folder
    held by the script's own process; the folder is closed to others' writes and a link
    at a dump's name is removed (before: the prefix stayed a name, and a link planted at
    fr-rank-2 in a group-writable ./diagnostics led the dump into any file)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "diagnostics").mkdir(mode=0o775)
    (tmp_path / "diagnostics").chmod(0o2775)
    (tmp_path / "precious").write_text("mine\n")
    (tmp_path / "diagnostics" / "fr-rank-2").symlink_to(tmp_path / "precious")
    printed = str(tmp_path / "diagnostics" / "fr-rank-")
    env = {**step(procid="2", localid="0", nodeid="1"), "TORCH_FR_DUMP_TEMP_FILE": printed,
           "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": printed}
    _, folder = held_setup(env)
    assert folder == tmp_path / "diagnostics"
    assert not os.path.lexists(folder / "fr-rank-2")
    assert folder.stat().st_mode & 0o022 == 0
    assert (tmp_path / "precious").read_text() == "mine\n"


# ------------------------------------------------------------------ the GPU
@pytest.mark.parametrize("gpus,local_rank,device", [
    (1, "3", 0),   # --gpus-per-task=1: LOCAL_RANK=3, but the task's one GPU is device 0
    (4, "2", 2),   # the node's GPUs visible to every task: the local rank
    (2, "3", 1),   # LOCAL_RANK past the visible GPUs: wraps (and warns, below)
])
def test_setup_selects_the_gpu_this_task_can_use(gpus, local_rank, device):
    cuda = FakeCuda(gpus)
    env = step(per_node="4(x2)", ntasks="8", procid=local_rank, localid=local_rank)
    launch, exported = run_setup(env, cuda=cuda.cuda, quiet=True)
    assert cuda.selected == [device]
    assert (launch.device, launch.gpu_index, exported["LOCAL_GPU"]) == \
        (f"cuda:{device}", device, str(device))
    assert launch.backend == "nccl"


def test_a_users_local_gpu_is_kept():
    cuda = FakeCuda(4)
    env = step(per_node="4(x2)", ntasks="8", procid="1", localid="1", LOCAL_GPU="3")
    launch, _ = run_setup(env, cuda=cuda.cuda)
    assert cuda.selected == [3] and launch.device == "cuda:3"


def launch_cli(env: dict[str, str], *args: str, capsys) -> tuple[int, str, str]:
    with mock.patch.dict(os.environ, env, clear=True), \
            mock.patch("workload.launch.resolve.usable_cpus", return_value=CPUS):
        status = main(list(args))
    out, err = capsys.readouterr()
    return status, out, err


ONE_GPU_RANK_3 = step(per_node="4(x2)", ntasks="8", procid="3", localid="3",
                      CUDA_VISIBLE_DEVICES="3")


def test_launch_env_exports_local_gpu_and_warns_about_local_rank(capsys):
    status, out, err = launch_cli(ONE_GPU_RANK_3, "env", "--command", "python", capsys=capsys)
    assert status == 0 and "LOCAL_GPU=0" in out.splitlines()
    assert "LOCAL_RANK=3 cannot index the 1 GPU(s)" in err and "LOCAL_GPU=0" in err
    # train picks its GPU itself: no warning for it.
    status, out, err = launch_cli(ONE_GPU_RANK_3, "env", "--command", "train", capsys=capsys)
    assert status == 0 and "LOCAL_GPU=0" in out and err == ""


def test_launch_check_warns_about_local_rank_naming_the_fix(capsys):
    status, out, _ = launch_cli(ONE_GPU_RANK_3, "check", capsys=capsys)
    assert status == 0  # one GPU per task is a sound layout: a warning, not a problem
    assert "warning: LOCAL_RANK=3 cannot index" in out and "srun --gpus-per-node" in out


def test_several_gpus_local_rank_cannot_index_is_a_warning_for_everyone(capsys):
    env = step(per_node="4(x2)", ntasks="8", procid="3", localid="3",
               CUDA_VISIBLE_DEVICES="0,1")
    status, out, err = launch_cli(env, "env", "--command", "train", capsys=capsys)
    assert status == 0 and "LOCAL_GPU=1" in out and "LOCAL_RANK=3 cannot index the 2" in err


def test_a_local_gpu_past_the_visible_ones_is_a_bad_value(capsys):
    status, _, err = launch_cli(step(CUDA_VISIBLE_DEVICES="0", LOCAL_GPU="2"), "env",
                                capsys=capsys)
    assert status == 2 and "LOCAL_GPU='2'" in err


# ------------------------------------------------------------------ preemption
def test_the_flag_then_exit_for_requeue(tmp_path):
    flag = PreemptionFlag().install(("USR2",))
    try:
        assert not flag.is_set()
        os.kill(os.getpid(), signal.SIGUSR2)
        assert flag.is_set() and flag.signal_name == "SIGUSR2"
    finally:
        flag.uninstall()
    marker = tmp_path / "requeue"
    with mock.patch.dict(os.environ, {"TRAIN_REQUEUE_FILE": str(marker)}), \
            pytest.raises(SystemExit) as exited:
        exit_for_requeue(12, flag.signal_name)
    assert exited.value.code == REQUEUE_EXIT_STATUS == 75
    assert marker.read_text() == "preempted by SIGUSR2 at step 12\n"


@pytest.mark.parametrize("name", ["PreemptionFlag", "REQUEUE_EXIT_STATUS", "exit_for_requeue",
                                  "request_requeue"])
def test_the_preemption_names_come_from_the_launch_layer_only(name):
    import workload.checkpoint as checkpoint

    assert name not in checkpoint.__all__
    with pytest.raises(AttributeError):
        getattr(checkpoint, name)


# ------------------------------------------------------------------ jobs
def test_jobs_copies_the_job_scripts_out(tmp_path, capsys):
    dest = tmp_path / "jobs"
    assert main(["jobs", str(dest)]) == 0
    copied = {path.relative_to(dest) for path in dest.rglob("*") if path.is_file()}
    shipped = {path.relative_to(REPO / "jobs") for path in (REPO / "jobs").rglob("*")
               if path.is_file()}
    assert copied == shipped | {Path("lib/jobstep.py")} and Path("own-script.sbatch") in copied
    assert main(["jobs", str(dest)]) == 2  # never overwrites silently
    assert "pass --force" in capsys.readouterr().err
    assert main(["jobs", str(dest), "--force"]) == 0


def test_jobs_names_where_it_looked(tmp_path, capsys):
    with mock.patch("workload.launch.jobs.candidates", return_value=[tmp_path / "none"]):
        assert main(["jobs", str(tmp_path / "out")]) == 2
    assert str(tmp_path / "none") in capsys.readouterr().err


def test_a_number_past_python_s_digit_limit_raises_naming_it():
    with pytest.raises(LaunchError, match="SLURM_PROCID=.*a whole number.*fix:"):
        run_setup(step(procid="7" * 5000))


@pytest.mark.parametrize("env,cpus", [c[1:] for c in CPU_SHARES],
                         ids=[c[0] for c in CPU_SHARES])
def test_setup_says_how_many_cpus_the_process_owns(env, cpus):
    launch, _ = run_setup(env | {"CUDA_VISIBLE_DEVICES": ""}, quiet=True)
    assert launch.cpus == cpus
