"""Is the libnccl a site binds into the container at least the one torch was built with?

Sites such as Sigma2 Olivia advise binding their NCCL module's libraries into the
container, first on its library path, so they replace the image's libnccl. An older one
than torch was built with can fail `import torch` with an undefined symbol
(pytorch/pytorch#186591), or fail later in a collective. A job checks this at start
(``python -m workload.launch nccl``, from jobs/sites/sigma2-olivia-binds.sh) and stops
with one line naming a module new enough; ``doctor`` reports both versions.

Versions come from the library itself, never from importing it here (this layer has no
torch): the file name EasyBuild and NGC give it (``libnccl.so.2.27.7``), else the version
string NCCL compiles into the binary (``2.27.7+cuda12.9``). What torch needs is what
``torch.cuda.nccl.version()`` reports with the bound folder taken off the library path,
asked of a separate Python process, else the version string of the libnccl that
process would load.
"""

from __future__ import annotations

import mmap
import os
import re
import subprocess
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

Version = tuple[int, int, int]

LIBRARY = "libnccl.so.2"
IN_NAME = re.compile(r"libnccl\.so\.(\d+)\.(\d+)\.(\d+)$")
IN_BINARY = re.compile(rb"(\d{1,2})\.(\d{1,3})\.(\d{1,3})\+cuda\d+\.\d+")
IN_MODULE = re.compile(r"NCCL/(\d+)\.(\d+)\.(\d+)")
# Where an image keeps the libnccl torch loads when nothing is bound (NGC: the system
# folders; pip wheels: nvidia/nccl/lib beside torch).
IMAGE_FOLDERS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64",
                 "/usr/local/lib", "/usr/lib")
# Old torch returned NCCL's old version code (major * 1000 + minor * 100 + patch). The
# question is on the job's way to its first step: torch is imported with the cyclic
# collector off and the process ends without the interpreter's finalization, which walks
# all torch made (1.9 -> 1.1 CPU-s on the 2-core machine).
TORCH_ASKS = ("import gc, os; gc.disable(); import torch; v = torch.cuda.nccl.version(); "
              "print(*(v if isinstance(v, tuple) else (v // 1000, v % 1000 // 100, v % 100)),"
              " sep='.', flush=True); os._exit(0)")


def parse(text: str) -> Version | None:
    found = re.fullmatch(r"\s*([0-9]{1,6})\.([0-9]{1,6})\.([0-9]{1,6})\s*", text)
    return tuple(int(part) for part in found.groups()) if found else None


def shown(version: Version | None) -> str:
    return ".".join(map(str, version)) if version else "unknown"


def library_version(path: Path) -> Version | None:
    """The version of a libnccl file: from its real name, else its version string."""
    real = path.resolve()
    named = IN_NAME.search(real.name)
    if named:
        return tuple(int(part) for part in named.groups())
    try:
        with real.open("rb") as handle, mmap.mmap(handle.fileno(), 0,
                                                  access=mmap.ACCESS_READ) as data:
            found = IN_BINARY.search(data)
            return tuple(int(part) for part in found.groups()) if found else None
    except (OSError, ValueError):  # unreadable, or empty (mmap refuses a 0-byte file)
        return None


def first_library(folders: Iterable[str]) -> Path | None:
    for folder in folders:
        if folder and (Path(folder) / LIBRARY).exists():
            return Path(folder) / LIBRARY
    return None


def library_path(env: Mapping[str, str]) -> list[str]:
    return [folder for folder in env.get("LD_LIBRARY_PATH", "").split(":") if folder]


def torch_version(env: Mapping[str, str], bound_folder: str) -> Version | None:
    """What torch.cuda.nccl.version() says in a process without the bound folder."""
    clean = dict(env)
    clean["LD_LIBRARY_PATH"] = ":".join(f for f in library_path(env) if f != bound_folder)
    try:
        done = subprocess.run([sys.executable, "-c", TORCH_ASKS], env=clean, timeout=300,
                              capture_output=True, text=True)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return parse(done.stdout) if done.returncode == 0 else None


def image_version(env: Mapping[str, str], bound_folder: str) -> Version | None:
    """The version string of the libnccl the image has when nothing is bound."""
    beside_torch = [str(Path(p) / "nvidia" / "nccl" / "lib") for p in sys.path if p]
    folders = [f for f in library_path(env) if f != bound_folder]
    found = first_library([*folders, *beside_torch, *IMAGE_FOLDERS])
    return library_version(found) if found else None


def module_for(needed: Version, modules: Iterable[str]) -> str | None:
    """The oldest module name (NCCL/X.Y.Z-...) at least `needed`; None when none is."""
    versions = []
    for name in modules:
        found = IN_MODULE.search(name)
        if found and tuple(int(p) for p in found.groups()) >= needed:
            versions.append((tuple(int(p) for p in found.groups()), name.strip()))
    return min(versions)[1] if versions else None


def verdict(bound: Version | None, needed: Version | None, where: Path,
            modules: Iterable[str]) -> tuple[bool, str]:
    """(fine, the one line to print) for a bound libnccl against what torch needs."""
    if bound is None or needed is None:
        return True, (f"nccl: cannot tell (bound {where}: {shown(bound)}, torch's: "
                      f"{shown(needed)}); not checked")
    if bound >= needed:
        return True, (f"nccl: bound libnccl {shown(bound)} ({where.parent}) >= "
                      f"{shown(needed)} torch was built with: ok")
    module = module_for(needed, modules)
    fix = (f"load {module} instead (NCCL_MODULE={module})" if module else
           f"load an NCCL module >= {shown(needed)} (module avail NCCL, after the stack that "
           "holds them: module load NRIS/GPU on Olivia), or bind none and "
           "use the image's own")
    return False, (f"nccl: the bound libnccl {shown(bound)} ({where.parent}) is older than "
                   f"{shown(needed)}, the NCCL torch was built with: {fix}")


def check(env: Mapping[str, str] | None = None, modules: Iterable[str] = (),
          needed: Version | None = None) -> tuple[bool, str]:
    env = os.environ if env is None else env
    bound = first_library(library_path(env))
    if bound is None:
        return True, "nccl: no libnccl on LD_LIBRARY_PATH: the image's own is used"
    folder = str(bound.parent)
    needed = needed or torch_version(env, folder) or image_version(env, folder)
    return verdict(library_version(bound), needed, bound, modules)
