"""The compile cache artifact: one file in the run folder that carries a `--compile` run's
compiled kernels to its next job, on any node.

The caches Inductor and Triton fill while compiling live on node-local storage (see
workload/caches.py): a requeued job on another node, or on the same node after its
$SLURM_TMPDIR was wiped, would compile everything again (minutes of a start). After the
first compiled step and after the first evaluation, rank 0 packs both folders into
`compile-cache-<key>.tar` in the run folder, where <key> names the torch, Triton, Python
and device versions the kernels were built for. Before its first step, every rank of the
next job unpacks the file of its own key into its node-local folders, and Inductor then
finds its graphs there. A file of another key is left alone with one line.

Why the folders and not torch's own `torch.compiler.save_cache_artifacts`: on the CPU its
artifact holds the generated code but not the C++ it compiles, so a warm start still
compiles everything (docs/performance.md: 0.73 of the cold start against 0.16).

What the file holds is code the process will run (shared libraries Inductor loads, and
its pickled graphs), so it is trusted like a program of the user's: it is only read when
it is a regular file owned by this user and writable by no one else (as ssh treats its
keys), checked on the descriptor it is then read from (a neighbour who swaps names in a
group-writable run folder cannot slip another file in between), and its members are
checked before anything is written (names inside the two folders, regular files and
folders only, a size cap). Anything else is ignored with one
line; the artifact never fails a run.
"""

from __future__ import annotations

import errno
import hashlib
import io
import json
import os
import platform
import stat
import tarfile
from importlib import metadata
from pathlib import Path, PurePosixPath

import torch

from workload.files import replacing, umask_mode
from workload.logs import logger
from workload.runfolder import RunFolder

FOLDERS = {"inductor": "TORCHINDUCTOR_CACHE_DIR", "triton": "TRITON_CACHE_DIR"}
VERSIONS = "versions.json"
MAX_BYTES = 8 * 2**30  # far above a model's kernels; a bound on what a file may unpack
Signature = frozenset[tuple[str, int]]


def versions(device: torch.device) -> dict[str, str]:
    """What the compiled kernels depend on."""
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        where = f"{torch.cuda.get_device_name(device)} sm_{major}{minor}"
    else:
        where = f"{platform.machine()} {torch.backends.cpu.get_cpu_capability()}"
    try:
        triton = metadata.version("triton")
    except metadata.PackageNotFoundError:
        triton = "none"
    return {"torch": torch.__version__, "triton": triton, "python": platform.python_version(),
            "device": where}


def artifact_key(found: dict[str, str]) -> str:
    """The key of the versions `found` in the artifact's name (RunFolder.compile_cache)."""
    return hashlib.sha256(json.dumps(found, sort_keys=True).encode()).hexdigest()[:12]


def cache_folders() -> dict[str, Path]:
    """The folders to carry: the ones set for this process (workload.caches sets both
    before torch is imported unless the user did)."""
    return {name: Path(os.environ[var]) for name, var in FOLDERS.items() if os.environ.get(var)}


def cache_files(folders: dict[str, Path]) -> dict[str, Path]:
    """Archive name -> file: every regular file of the folders but their locks."""
    found = {}
    for name, folder in folders.items():
        for path in sorted(folder.rglob("*")) if folder.is_dir() else []:
            rel = path.relative_to(folder)
            if rel.parts[0] == "locks" or path.suffix == ".lock" or path.is_symlink():
                continue
            if path.is_file():
                found[f"{name}/{rel.as_posix()}"] = path
    return found


def signature(files: dict[str, Path]) -> Signature:
    return frozenset((name, path.stat().st_size) for name, path in files.items())


def trust_problem(info: os.stat_result) -> str | None:
    """Why the artifact whose open descriptor fstat gave `info` must not be read, or None."""
    if not stat.S_ISREG(info.st_mode):
        return "it is not a regular file"
    if info.st_uid != os.getuid():
        return f"it belongs to uid {info.st_uid}, not to you"
    if info.st_mode & 0o022:
        return f"others may write it (mode {stat.filemode(info.st_mode)})"
    return None


def checked_members(tar: tarfile.TarFile, folders: dict[str, Path]) -> list[tarfile.TarInfo]:
    """The members to unpack, once every one of them is safe; ValueError names the first
    that is not."""
    members = []
    total = 0
    for member in tar.getmembers():
        parts = PurePosixPath(member.name).parts
        if member.name == VERSIONS:
            continue
        if not parts or parts[0] not in folders or ".." in parts or member.name.startswith("/"):
            raise ValueError(f"member {member.name!r} is outside the cache folders")
        if not (member.isfile() or member.isdir()):
            raise ValueError(f"member {member.name!r} is not a file or a folder")
        total += member.size
        if total > MAX_BYTES:
            raise ValueError(f"it unpacks to more than {MAX_BYTES // 2**30} GiB")
        members.append(member)
    return members


def unpack(tar: tarfile.TarFile, members: list[tarfile.TarInfo],
           folders: dict[str, Path]) -> int:
    """Write the files this node does not have yet; the ranks of a node may unpack at the
    same time, so each file appears whole (written aside, then renamed). The count."""
    written = 0
    for member in members:
        top, *rest = PurePosixPath(member.name).parts
        target = folders[top].joinpath(*rest)
        if member.isdir() or target.exists():
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        mode = 0o700 if member.mode & 0o100 else 0o600
        with tar.extractfile(member) as source, replacing(target, mode) as sink:
            sink.write(source.read())
        written += 1
    return written


class CompileCache:
    """The artifact of one run folder: `load` on every rank before the first compiled
    step, `save` (rank 0) after the first step and the first evaluation."""

    def __init__(self, folder: RunFolder, device: torch.device, is_main: bool):
        self.versions = versions(device)
        self.run_folder = folder
        self.path = folder.compile_cache(artifact_key(self.versions))
        self.is_main = is_main
        self.folders = cache_folders()
        self.saved: Signature = frozenset()
        self.facts: dict = {"artifact": self.path.name, "files_loaded": 0}

    def load(self) -> None:
        if not self.folders:
            return
        if not self.path.exists():
            others = [p.name for p in self.run_folder.compile_caches]
            if others and self.is_main:
                logger.info(f"compile cache: {', '.join(others)} made for other versions "
                            f"than {self.describe()}: not used, compiling from scratch")
            return
        try:
            self.facts["files_loaded"] = self.read()
        except (OSError, tarfile.TarError, ValueError) as error:
            logger.warning(f"compile cache {self.path} not used ({error}): compiling from "
                           "scratch")
            return
        self.saved = signature(cache_files(self.folders))
        if self.is_main:
            logger.info(f"compile cache: {self.facts['files_loaded']} files from "
                        f"{self.path.name} ({self.describe()})")

    def read(self) -> int:
        """Open once (no link followed, no wait on a FIFO), check what was opened, and
        read the archive from that descriptor."""
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as error:
            if error.errno == errno.ELOOP:
                raise ValueError("it is a symbolic link, not a regular file") from None
            raise
        with os.fdopen(fd, "rb") as file:
            if problem := trust_problem(os.fstat(fd)):
                raise ValueError(problem)
            with tarfile.open(fileobj=file) as tar:
                return unpack(tar, checked_members(tar, self.folders), self.folders)

    def save(self, *_ignored) -> None:
        """Pack the folders when they changed since the last pack (rank 0); a failure is
        one line, never the run's."""
        self.record_use()
        files = cache_files(self.folders)
        current = signature(files)
        if not self.is_main or not files or current == self.saved:
            return
        try:
            self.write(files)
        except OSError as error:
            logger.warning(f"compile cache not saved to {self.path} ({error}); the next "
                           "job compiles from scratch")
            return
        self.saved = current
        logger.info(f"compile cache: {len(files)} files saved to {self.path.name} "
                    f"({self.path.stat().st_size / 2**20:.1f} MiB)")

    def write(self, files: dict[str, Path]) -> None:
        """The archive, through a private temporary beside it (workload.files.replacing),
        readable by the group as the umask allows and writable by no one else."""
        with (replacing(self.path, umask_mode() & ~0o022) as sink,
              tarfile.open(fileobj=sink, mode="w") as tar):
            data = json.dumps(self.versions, indent=2).encode()
            info = tarfile.TarInfo(VERSIONS)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
            for name, path in files.items():
                tar.add(path, arcname=name, recursive=False)

    def record_use(self) -> None:
        """How many graphs came from the cache and how many were compiled (Inductor's
        counters, for the summary)."""
        from torch._dynamo.utils import counters

        self.facts["graphs_from_cache"] = counters["inductor"]["fxgraph_cache_hit"]
        self.facts["graphs_compiled"] = counters["inductor"]["fxgraph_cache_miss"]

    def describe(self) -> str:
        return ", ".join(f"{key} {value}" for key, value in self.versions.items())
