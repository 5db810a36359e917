"""Checks one process can make by itself: devices, /dev/shm, DALI, TF32, threads, folders."""

from __future__ import annotations

import getpass
import importlib.util
import os
import platform
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from workload.caches import CACHE_FOLDERS, COMPILE_CACHES, FATAL_CACHES, is_chosen_value
from workload.launch.devices import default_workers
from workload.files import unwritable_reason
from workload.launch import nccl
from workload.doctor.findings import FAIL, INFO, OK, WARN, Finding

SHM_MIN_BYTES = 1 << 30  # below 1 GiB, DataLoader workers and NCCL's SHM transport fail
PREFETCH = 2  # batches each DataLoader worker keeps ready (torch's default prefetch_factor)
MATMUL_SIZE = 512


# ---------------------------------------------------------------- devices
def matmul_check(device: torch.device) -> Finding:
    """A small matmul on the device, compared with the same product in float64 on the CPU."""
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    try:
        gen = torch.Generator().manual_seed(0)
        a, b = (torch.randn(MATMUL_SIZE, MATMUL_SIZE, generator=gen) for _ in range(2))
        # float32 without TF32, whatever the user's switches: an exact-enough reference.
        with _fp32_matmul():
            got = (a.to(device) @ b.to(device)).cpu().double()
        error = ((got - a.double() @ b.double()).abs().max() / MATMUL_SIZE ** 0.5).item()
    except RuntimeError as exc:  # a GPU that is visible but unusable (ECC, MIG, driver)
        return Finding("matmul", FAIL, f"{device} ({name}): matmul failed: {exc}".splitlines()[0],
                       "drain this node or report it to the site; check nvidia-smi on it")
    if not error < 1e-3:
        return Finding("matmul", FAIL, f"{device} ({name}): matmul off by {error:.2e}",
                       "wrong results from this GPU: exclude the node (sbatch --exclude)")
    return Finding("matmul", OK, f"{device} ({name}): {MATMUL_SIZE}x{MATMUL_SIZE} matmul "
                                 f"correct (error {error:.1e})")


class _fp32_matmul:
    """Switch TF32 off for the duration, then restore the user's setting."""

    def __enter__(self):
        self.saved = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = False

    def __exit__(self, *exc):
        torch.backends.cuda.matmul.allow_tf32 = self.saved


def gpu_visibility(requested: str) -> Finding:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if torch.cuda.is_available():
        names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        return Finding("gpu", OK, f"{len(names)} visible: {', '.join(names)}"
                       + (f" (CUDA_VISIBLE_DEVICES={visible})" if visible is not None else ""))
    nodes = sorted(str(p) for p in Path("/dev").glob("nvidia[0-9]*"))
    if nodes:
        return Finding("gpu", FAIL if requested == "cuda" else WARN,
                       f"GPU device files exist ({', '.join(nodes)}) but PyTorch sees no GPU",
                       "start the container with GPUs: apptainer exec --nv, docker run "
                       "--gpus all; check CUDA_VISIBLE_DEVICES is not empty")
    if requested == "cuda":
        return Finding("gpu", FAIL, "--device cuda, but no GPU is visible",
                       "run on a GPU node (sbatch --gpus-per-node=N) or pass --device cpu")
    return Finding("gpu", INFO, "no GPU visible: training runs on the CPU")


def devices_to_check(device: torch.device, every_gpu: bool) -> list[torch.device]:
    """All GPUs when one process checks the node, else just this rank's device."""
    if device.type == "cuda" and every_gpu:
        return [torch.device("cuda", i) for i in range(torch.cuda.device_count())]
    return [device]


# ---------------------------------------------------------------- /dev/shm
@dataclass(frozen=True)
class LoaderNeed:
    """What train's DataLoader workers hold in /dev/shm on this node at once: each of a
    node's processes has `workers` workers, each with PREFETCH batches ready (torch's
    default prefetch factor), float32 batches (the larger of the two pipelines')."""

    processes: int
    workers: int
    batch_size: int
    side: int

    @property
    def batch_bytes(self) -> int:
        return self.batch_size * 3 * self.side * self.side * 4

    @property
    def total(self) -> int:
        return self.processes * self.workers * PREFETCH * self.batch_bytes

    def __str__(self) -> str:
        return (f"{self.processes} process(es) x {self.workers} loader workers x {PREFETCH} "
                f"batches of {_size(self.batch_bytes)} at --batch-size {self.batch_size}, "
                f"{self.side} px")


def loader_need(batch_size: int, image_size: int, processes: int) -> LoaderNeed:
    return LoaderNeed(processes, default_workers(processes), batch_size, image_size or 32)


def shm_check(path: str = "/dev/shm", need: LoaderNeed | None = None) -> Finding:
    if os.path.exists(path) and not os.path.isdir(path):  # statvfs reads a file's mount
        return Finding("shm", WARN, f"{path} is not a folder, so not a shared-memory mount",
                       "pass --shm-path the mount to check (default /dev/shm)")
    try:
        stats = os.statvfs(path)
    except OSError as error:
        return Finding("shm", WARN, f"{path} is missing ({error.strerror})",
                       "DataLoader workers and NCCL need it: docker run --ipc=host "
                       "(or --shm-size=8g); apptainer binds the host's /dev/shm by default")
    size = stats.f_blocks * stats.f_frsize
    detail = f"{path} is {_size(size)} ({_size(stats.f_bavail * stats.f_frsize)} free)"
    if size < SHM_MIN_BYTES:
        return Finding("shm", WARN, detail + ", below 1 GiB: DataLoader workers and NCCL's "
                       "shared-memory transport fail with bus errors",
                       "docker run --ipc=host (or --shm-size=8g); podman run --shm-size=8g; "
                       "Kubernetes: an emptyDir with medium: Memory on /dev/shm")
    if need is None:
        return Finding("shm", OK, detail)
    detail += f"; the data loaders need about {_size(need.total)} ({need})"
    if need.total > stats.f_bavail * stats.f_frsize:
        return Finding("shm", WARN, detail + ": more than is free, so workers fail with bus "
                       "errors", "a larger /dev/shm (docker run --shm-size, or --ipc=host), "
                       "or fewer loader workers (train --workers) or a smaller --batch-size")
    return Finding("shm", OK, detail)


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024


# ---------------------------------------------------------------- DALI
def dali_check() -> Finding:
    # find_spec of a submodule imports its parent: ask for the namespace package first.
    if importlib.util.find_spec("nvidia") is None or not importlib.util.find_spec("nvidia.dali"):
        return Finding("dali", INFO, "not installed: the device and torch data backends are used")
    try:
        import nvidia.dali
        import nvidia.dali.backend as backend
    except Exception as error:  # a broken install raises more than ImportError
        return Finding("dali", WARN, f"installed but fails to import: {error}".splitlines()[0],
                       "reinstall the wheel for this CUDA: pip install nvidia-dali-cuda"
                       f"{_cuda_tag()}")
    built = getattr(backend, "__cuda_version__", 0) // 1000 or None
    torch_major = int(torch.version.cuda.split(".")[0]) if torch.version.cuda else None
    detail = f"{nvidia.dali.__version__}, built for CUDA {built}, torch for CUDA {torch_major}"
    if built and torch_major and built != torch_major:
        return Finding("dali", WARN, detail + ": CUDA majors differ",
                       f"pip install nvidia-dali-cuda{_cuda_tag()} (the wheel for torch's CUDA "
                       f"{torch_major}) in place of nvidia-dali-cuda{built}0")
    return Finding("dali", OK, detail)


def _cuda_tag() -> str:
    return f"{torch.version.cuda.split('.')[0]}0" if torch.version.cuda else "120"


# ---------------------------------------------------------------- TF32
def tf32_check() -> Finding:
    matmul = torch.backends.cuda.matmul.allow_tf32
    cudnn = torch.backends.cudnn.allow_tf32
    detail = (f"matmul allow_tf32={matmul}, cudnn allow_tf32={cudnn}, float32 matmul "
              f"precision {torch.get_float32_matmul_precision()!r} (train sets both from "
              "--precision)")
    if os.environ.get("NVIDIA_TF32_OVERRIDE") == "0":
        return Finding("tf32", WARN, detail + "; NVIDIA_TF32_OVERRIDE=0 disables TF32 "
                       "everywhere, so --precision tf32 runs as fp32",
                       "unset NVIDIA_TF32_OVERRIDE unless fp32 is what you want")
    return Finding("tf32", OK, detail)


# ---------------------------------------------------------------- threads
def threads_check(local_world_size: int = 1) -> Finding:
    cpus = len(os.sched_getaffinity(0))
    # torch caps its own pool at the cores, but OpenMP in other libraries takes the variable.
    threads = max(torch.get_num_threads(), _int_env("OMP_NUM_THREADS"))
    per_task = os.environ.get("SLURM_CPUS_PER_TASK")
    detail = (f"torch uses {torch.get_num_threads()} threads, OMP_NUM_THREADS="
              f"{os.environ.get('OMP_NUM_THREADS', 'unset')}, {cpus} CPUs in this process's "
              f"affinity, SLURM_CPUS_PER_TASK={per_task or 'unset'}")
    if threads > cpus:
        return Finding("threads", WARN, detail + f": {threads} threads on {cpus} CPUs "
                       "oversubscribe them", f"export OMP_NUM_THREADS={cpus} or ask for more "
                       "CPUs (srun --cpus-per-task=N)")
    if cpus > 1 and threads == 1 and local_world_size == 1:
        return Finding("threads", WARN, detail + ": one thread leaves CPUs idle",
                       f"unset OMP_NUM_THREADS=1 or export OMP_NUM_THREADS={cpus}")
    return Finding("threads", OK, detail)


def _int_env(name: str) -> int:
    try:
        return int(os.environ.get(name, ""))
    except ValueError:
        return 0


# ---------------------------------------------------------------- folders
def cache_dirs() -> dict[str, str]:
    """Where torch, torch.compile and Triton write caches: the folders the command chose at
    start (workload/caches.py), or the user's own; torch's and Triton's defaults where
    neither is set (no temp folder could hold the chosen one)."""
    user = getpass.getuser()  # torch names its inductor cache folder after the user
    home_cache = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return {
        "TORCH_HOME": torch.hub.get_dir(),
        "TORCHINDUCTOR_CACHE_DIR": os.environ.get("TORCHINDUCTOR_CACHE_DIR")
        or os.path.join(tempfile.gettempdir(), f"torchinductor_{user}"),
        "TRITON_CACHE_DIR": os.environ.get("TRITON_CACHE_DIR")
        or os.path.expanduser("~/.triton/cache"),
        "XDG_CACHE_HOME": home_cache,
    }


def cache_origin(variable: str) -> str:
    if variable not in CACHE_FOLDERS:
        return "set by you" if os.environ.get(variable) else "the default"
    if is_chosen_value(variable, os.environ):
        return "this user's node-local folder" if os.environ.get(variable) else "the default"
    return "set by you"


def output_dir_check(path: str) -> Finding:
    problem = unwritable_reason(path)
    if problem:
        return Finding("output-dir", FAIL, f"{path} is not writable ({problem})",
                       "pass train --output-dir a folder you can write to, e.g. "
                       "$SCRATCH/runs/NAME (and bind it into the container)")
    return Finding("output-dir", OK, f"{path} is writable")


def cache_checks() -> list[Finding]:
    found = []
    for variable, path in cache_dirs().items():
        problem = unwritable_reason(path)
        where = f"{variable} {path} ({cache_origin(variable)})"
        if problem:
            status = FAIL if variable in FATAL_CACHES else WARN
            found.append(Finding("cache", status, f"{where} is not writable ({problem})",
                                 cache_fix(variable)))
        else:
            found.append(Finding("cache", OK, f"{where} is writable"))
    return found


def cache_fix(variable: str) -> str:
    if variable in COMPILE_CACHES:  # a file per kernel: never on the shared file system
        return (f"export {variable}=<a node-local folder you can write>, or unset it: "
                f"hpc-train then uses one of yours under $SLURM_TMPDIR or the temp folder")
    return f"export {variable}=$SCRATCH/.cache/{variable.lower()}"


def nccl_check() -> Finding:
    """Both NCCL versions: the one torch loaded, and a libnccl bound on LD_LIBRARY_PATH
    (Olivia's module route) against the image's own, which torch was built with."""
    try:
        loaded = tuple(torch.cuda.nccl.version())
    except (AttributeError, RuntimeError, TypeError):  # a CPU-only torch has no NCCL
        loaded = None
    detail = f"torch.cuda.nccl.version() {nccl.shown(loaded)}"
    bound = nccl.first_library(nccl.library_path(os.environ))
    if bound is None:
        return Finding("nccl", INFO, detail + "; no libnccl bound on LD_LIBRARY_PATH")
    version = nccl.library_version(bound)
    image = nccl.image_version(os.environ, str(bound.parent))
    detail += (f"; bound {nccl.shown(version)} ({bound.parent}); the image's own "
               f"{nccl.shown(image)}")
    if version and image and version < image:
        return Finding("nccl", WARN, detail + ": the bound one is older",
                       "load an NCCL module at least as new as the image's "
                       "(python -m workload.launch nccl names one)")
    return Finding("nccl", OK, detail)


# ---------------------------------------------------------------- versions
def versions() -> dict:
    from workload.records import versions as run_versions
    try:
        found = dict(run_versions())
    except Exception as error:  # e.g. torchvision's import failing on an unwritable cache
        found = dict(torch=torch.__version__, error=f"{type(error).__name__}: {error}")
    if torch.cuda.is_available():
        found["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))  # GPU-only line
    found["python"] = platform.python_version()
    return found
