"""Cache folders chosen at start, for this user and this node: the one home of the rule.

Triton, Inductor, CUDA's JIT, torch hub, torch extensions, DALI's numba operators,
matplotlib and pip each write a cache. The image cannot fix their folders: it does not know
the uid it will run as, and Apptainer and Charliecloud bind the host's /tmp, shared by every
user of a node, so one fixed folder there is created by the first user's job (mode 755) and
refused to everyone else's. So the image sets none of these variables, and every command
(train, evaluate, predict, bench, doctor), `setup()` and `python -m workload.launch env`
choose, at start and before torch is imported, a folder for each one the user did not set:

1. `$SLURM_TMPDIR/hpc-train-cache` when SLURM gives the job a node-local folder;
2. else `<temp folder>/hpc-train-<uid>` ($TMPDIR, else /tmp; /tmp when $TMPDIR is on a
   shared file system): this user's own, mode 0700, kept across the user's jobs on the
   node so compiled kernels are found again;
3. else (that folder belongs to someone else, or is a symbolic link) a fresh
   `<temp folder>/hpc-train-<uid>-XXXXXXXX` for this job alone.

Never under $HOME, and never on a shared file system: the compile caches are thousands of
small files (an inode quota on Lustre/GPFS; stale handles on NFS). A value the user set
wins and is only checked (`user_cache_problems`; `doctor` reports it), but one torch would
fail to make as it is imported (Inductor's: FATAL_CACHES) ends a command before any work
with its one line and status 2, where it was a traceback. The folder chosen is
exported as HPC_TRAIN_CACHE_ROOT, so the processes a command starts (torchrun's workers, a
script after entrypoint.sh) know those values are the package's, not the user's, and keep
them. A folder on a shared file system (NFS, Lustre, GPFS, ... read from /proc/self/mounts)
is passed over like one that cannot be used. Standard library only.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import MutableMapping
from dataclasses import dataclass, field
from pathlib import Path

from workload.errors import UsageError
from workload.files import private_folder_problem as own_private_folder
from workload.files import unwritable_reason
from workload.logs import warn

# Each cache variable and its folder's name inside the chosen one.
CACHE_FOLDERS = {"TRITON_CACHE_DIR": "triton", "TORCHINDUCTOR_CACHE_DIR": "inductor",
                 "TORCH_EXTENSIONS_DIR": "torch_extensions", "TORCH_HOME": "torch",
                 "CUDA_CACHE_PATH": "nv-compute", "NUMBA_CACHE_DIR": "numba",
                 "MPLCONFIGDIR": "matplotlib", "PIP_CACHE_DIR": "pip"}
# The caches torch.compile fills with a file per kernel: never on a shared file system.
COMPILE_CACHES = ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")
# torch creates its inductor cache folder when torchvision (or torch._dynamo) is imported:
# a folder there that cannot be made ends a command at its first line. The other caches
# only matter for downloads or compiling.
FATAL_CACHES = ("TORCHINDUCTOR_CACHE_DIR",)
ROOT_VARIABLE = "HPC_TRAIN_CACHE_ROOT"
# Shared (network or parallel) file systems, by their /proc/mounts type.
NETWORK_FILE_SYSTEMS = {"nfs", "nfs4", "lustre", "gpfs", "cifs", "smb3", "smbfs", "beegfs",
                        "ceph", "fuse.ceph-fuse", "glusterfs", "fuse.glusterfs", "fuse.sshfs",
                        "wekafs", "panfs", "pvfs2", "orangefs", "afs", "fuse.juicefs"}
MOUNTS_FILE = Path("/proc/self/mounts")
# Every variable choose_caches may set (the launch resolver prints them for entrypoint.sh).
CACHE_KEYS = (*CACHE_FOLDERS, ROOT_VARIABLE)


@dataclass(frozen=True)
class CachePlan:
    """What choose_caches decided: the folder (None when no temp folder could hold one),
    the variables it set, the user's own values kept, and one line for each folder passed
    over (each names the variable behind it and its fix)."""

    root: Path | None
    chosen: dict[str, str] = field(default_factory=dict)
    yours: dict[str, str] = field(default_factory=dict)
    notes: tuple[str, ...] = ()


def temp_folders(env: MutableMapping[str, str]) -> list[Path]:
    """$TMPDIR (else /tmp); /tmp after a TMPDIR on a shared file system."""
    tmp = Path(env.get("TMPDIR") or "/tmp")
    return [tmp, Path("/tmp")] if shared_file_system(tmp) else [tmp]


def nearest_existing(path: str | Path) -> Path:
    folder = Path(path).expanduser().absolute()
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    return folder.resolve()


def unescape(field: str) -> str:
    """A /proc/mounts field: space, tab, newline and backslash are written as octal."""
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(code, char)
    return field


def file_system_type(path: str | Path, mounts: str | None = None) -> str:
    """The type of the file system `path` (or its nearest existing parent) is on, from
    MOUNTS_FILE (this process's mount namespace: what a container sees) unless `mounts`
    is given: the mount with the longest matching mount point, the last one mounted where
    two match; "unknown" where the table cannot be read."""
    try:
        mounts = MOUNTS_FILE.read_text() if mounts is None else mounts
    except OSError:
        return "unknown"
    folder = str(nearest_existing(path))
    best = -1
    kind = "unknown"
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) < 3:
            continue
        point = unescape(fields[1])
        inside = folder == point or folder.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= best:
            best = len(point)
            kind = fields[2]
    return kind


def shared_file_system(path: Path) -> str | None:
    """Why `path` is no place for a cache of many small files (None: it is node-local)."""
    kind = file_system_type(path)
    return f"{path} is on {kind}, a shared file system" if kind in NETWORK_FILE_SYSTEMS else None


def private_folder_problem(path: Path) -> str | None:
    """None when `path` is a node-local folder only this user can enter
    (workload.files.private_folder_problem), else why not (a shared file system too)."""
    if shared := shared_file_system(path.parent):
        return shared
    return own_private_folder(path)


def root_candidates(env: MutableMapping[str, str]) -> list[tuple[Path, str]]:
    """The folders to try in order, each with the fix for when it cannot be used."""
    found = []
    if env.get(ROOT_VARIABLE):
        found.append((Path(env[ROOT_VARIABLE]), f"unset {ROOT_VARIABLE}"))
    if env.get("SLURM_TMPDIR"):
        found.append((Path(env["SLURM_TMPDIR"]) / "hpc-train-cache",
                      "bind $SLURM_TMPDIR into the container (apptainer exec --bind "
                      "$SLURM_TMPDIR; pyxis: srun --container-mounts=$SLURM_TMPDIR)"))
    for tmp in temp_folders(env):
        found.append((tmp / f"hpc-train-{os.getuid()}",
                      "export TMPDIR=<a node-local folder of yours>"))
    return found


def private_root(env: MutableMapping[str, str]) -> tuple[Path | None, list[str]]:
    """The first usable candidate, else a fresh folder for this job; with a line for each
    candidate passed over (the SLURM_TMPDIR one, the per-user one)."""
    notes = []
    for path, fix in root_candidates(env):
        problem = private_folder_problem(path)
        if problem is None:
            return path, notes
        notes.append(f"caches: {problem}: {fix}")
    for tmp in temp_folders(env):
        try:
            if not shared_file_system(tmp):
                fresh = tempfile.mkdtemp(prefix=f"hpc-train-{os.getuid()}-", dir=tmp)
                notes[-1] += f"; using {fresh} for this job"
                return Path(fresh), notes
        except OSError as error:
            notes.append(f"caches: no folder can be made in {tmp} ({error.strerror})")
    notes.append("caches: no node-local temp folder to hold them: export TMPDIR=<a writable "
                 "node-local folder>")
    return None, notes


def is_chosen_value(variable: str, env: MutableMapping[str, str]) -> bool:
    """Whether `variable` is unset or holds the package's or torch's own choice (not the
    user's)."""
    value = env.get(variable)
    root = env.get(ROOT_VARIABLE)
    if not value or (root and value == str(Path(root) / CACHE_FOLDERS[variable])):
        return True
    return variable == "TORCHINDUCTOR_CACHE_DIR" and is_inductor_default(value)


def is_inductor_default(value: str) -> bool:
    """Inductor's own default, <tmp>/torchinductor_<user>: importing torch._dynamo writes
    it into os.environ (torch/_inductor/runtime/cache_dir_utils.py, cache_dir()), so every
    process started by a Python that imported torch inherits it, another uid's included
    (a launcher, a notebook, a test runner). Torch's choice, not the user's."""
    path = Path(value)
    return path.name.startswith("torchinductor_") and str(path.parent) in (
        tempfile.gettempdir(), "/tmp")


def choose_caches(env: MutableMapping[str, str] | None = None) -> CachePlan:
    """Point each cache variable the user did not set at this user's node-local folder
    (the module docstring says which); the user's own values are kept. Updates `env`
    (default os.environ): call it before torch is imported."""
    env = os.environ if env is None else env
    to_choose = [v for v in CACHE_FOLDERS if is_chosen_value(v, env)]
    yours = {v: env[v] for v in CACHE_FOLDERS if v not in to_choose}
    if not to_choose:
        return CachePlan(None, yours=yours)
    root, notes = private_root(env)
    if root is None:
        return CachePlan(None, yours=yours, notes=tuple(notes))
    chosen = {variable: str(root / CACHE_FOLDERS[variable]) for variable in to_choose}
    env.update(chosen)
    env[ROOT_VARIABLE] = str(root)
    return CachePlan(root, chosen, yours, tuple(notes))


def user_cache_problems(env: MutableMapping[str, str] | None = None) -> dict[str, str]:
    """Each cache variable the user set to a folder that cannot be written (made if
    missing), with one line naming it, why, and the fix."""
    env = os.environ if env is None else env
    found = {}
    for variable in CACHE_FOLDERS:
        if is_chosen_value(variable, env):
            continue
        problem = unwritable_reason(env[variable], create=True)
        if problem:
            found[variable] = (f"{variable}={env[variable]} is not writable ({problem}): set "
                               f"it to a folder you can write, or unset it to let hpc-train "
                               f"use a node-local one")
    return found


def use_private_caches(source: str, env: MutableMapping[str, str] | None = None,
                       quiet: bool = False, refuse_fatal: bool = True) -> CachePlan:
    """choose_caches at a command's start, each folder passed over said on stderr; with
    `refuse_fatal` (a command about to import torch), a folder of the user's that torch
    would fail to make on import (FATAL_CACHES) is a UsageError of its one line, before
    any work, where it was a warning and then a traceback."""
    plan = choose_caches(env)
    for note in () if quiet else plan.notes:
        warn(source, note)
    problems = user_cache_problems(env)
    for variable in FATAL_CACHES if refuse_fatal else ():
        if variable in problems:
            raise UsageError(problems[variable])
    return plan
