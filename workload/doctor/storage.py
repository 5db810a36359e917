"""What `doctor` checks of the folders a start writes to, beyond their being writable:
the temp folder (writable, and not mounted noexec: Triton and Inductor load the kernels
they compile as shared libraries, and a noexec /tmp breaks them), the compile caches
(node-local: on NFS, Lustre or GPFS a file per kernel exhausts the inode quota and meets
stale file handles across nodes; not noexec), and $HOME (writable: programs other than
hpc-train write ~/.cache and ~/.config). Standard library only.

The file system under a folder is read from /proc/self/mounts (this process's mount
namespace: what a container sees), the mount flags from statvfs.
"""

from __future__ import annotations

import os
from pathlib import Path

from workload.caches import COMPILE_CACHES, NETWORK_FILE_SYSTEMS, file_system_type, nearest_existing
from workload.doctor.findings import FAIL, OK, WARN, Finding
from workload.files import unwritable_reason

NODE_LOCAL_FIX = "$SLURM_TMPDIR or a node-local folder mounted without noexec"


def is_noexec(path: str | Path) -> bool:
    try:
        return bool(os.statvfs(nearest_existing(path)).f_flag & os.ST_NOEXEC)
    except OSError:  # not searchable: the writable checks name that
        return False


def temp_folder_check() -> Finding:
    path = os.environ.get("TMPDIR") or "/tmp"
    fix = f"export TMPDIR=<{NODE_LOCAL_FIX}>"
    problem = unwritable_reason(path)
    if problem:
        return Finding("temp", FAIL, f"the temp folder {path} is not writable ({problem})", fix)
    if is_noexec(path):
        return Finding("temp", WARN, f"the temp folder {path} is mounted noexec: Triton and "
                       "Inductor cannot load the kernels they compile there (--compile)", fix)
    return Finding("temp", OK, f"the temp folder {path} is writable and allows programs")


def compile_cache_check(variable: str, mounts: str | None = None) -> Finding:
    """A compile cache that the doctor's cache check found writable: node-local and
    exec-able."""
    path = os.environ.get(variable)
    if not path:
        return Finding("cache-storage", OK, f"{variable} is unset: the compiler's default")
    kind = file_system_type(path, mounts)
    fix = (f"export {variable}=<{NODE_LOCAL_FIX}>, or unset it: hpc-train then uses a "
           f"node-local folder of yours")
    if kind in NETWORK_FILE_SYSTEMS:
        return Finding("cache-storage", WARN, f"{variable} {path} is on {kind}, a shared file "
                       "system: a file per compiled kernel fills its inode quota and meets "
                       "stale file handles across nodes", fix)
    if is_noexec(path):
        return Finding("cache-storage", WARN, f"{variable} {path} is mounted noexec: the "
                       "kernels compiled into it cannot be loaded", fix)
    return Finding("cache-storage", OK, f"{variable} {path} is node-local ({kind}) and "
                   "allows programs")


def home_check() -> Finding:
    home = os.environ.get("HOME")
    fix = ("apptainer exec --home <a writable folder of yours>, or export HOME=<a writable "
           "folder>; hpc-train's own caches are not under $HOME")
    if not home:
        return Finding("home", WARN, "HOME is unset: programs that write ~/.cache or "
                       "~/.config (pip, matplotlib, Hugging Face) fail", fix)
    problem = unwritable_reason(home)
    if problem:
        return Finding("home", WARN, f"HOME {home} is not writable ({problem}): programs "
                       "that write ~/.cache or ~/.config (pip, Hugging Face) fail", fix)
    return Finding("home", OK, f"HOME {home} is writable")


def storage_checks() -> list[Finding]:
    found = [temp_folder_check(), home_check()]
    for variable in COMPILE_CACHES:
        path = os.environ.get(variable)
        if path is None or unwritable_reason(path) is None:  # the cache check names that
            found.append(compile_cache_check(variable))
    return found
