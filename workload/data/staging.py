"""`--stage-to DIR`: the dataset copied (a folder) or unpacked (a `.tar`, `.tar.gz`) to
node-local storage such as $SLURM_TMPDIR, once per node, before the loaders open it.

Local rank 0 of each node stages; the node's other ranks wait for it (a gloo group with a
long timeout, so a copy longer than --dist-timeout is no failure) and every rank learns of
any node's failure. What was staged is verified against the source's file list (names and
sizes) and recorded in `<DIR>/<name>.manifest.json`; a later run on the node that finds a
complete staging of the same source reuses it. Copies go to a private folder first and are
renamed into place, so two stagers on one shared folder cannot mix their files.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import tarfile
import time
from datetime import timedelta
from pathlib import Path

import torch.distributed as dist

from workload.config import TrainConfig
from workload.distributed import DistInfo
from workload.errors import UsageError
from workload.files import write_json
from workload.logs import logger

TAR_SUFFIXES = (".tar.gz", ".tgz", ".tar")
WAIT_FOR_STAGING = timedelta(hours=6)  # how long the other ranks wait for a node's copy


def stage_data(cfg: TrainConfig, info: DistInfo) -> str:
    """The data folder to read: the staged copy with --stage-to, else --data-dir."""
    if not cfg.data.stage_to:
        return cfg.data.data_dir
    source = Path(cfg.data.data_dir).expanduser().resolve()
    target = Path(cfg.data.stage_to).expanduser().resolve() / staged_name(source)
    status = None
    if info.local_rank == 0:
        try:
            status = dict(ok=True, text=stage_once(source, target))
        except (UsageError, OSError) as error:
            status = dict(ok=False, text=f"staging {source} to {target} failed: {error}")
    statuses = [s for s in _gather(status, info) if s is not None]
    for failed in (s for s in statuses if not s["ok"]):
        raise UsageError(failed["text"])
    for s in statuses:
        logger.info(s["text"])
    return str(data_root(target))


def _gather(status: dict | None, info: DistInfo) -> list:
    if info.world_size == 1 or not dist.is_initialized():
        return [status]
    group = dist.new_group(backend="gloo", timeout=WAIT_FOR_STAGING)
    gathered: list = [None] * info.world_size
    dist.all_gather_object(gathered, status, group=group)
    return gathered


def node_name() -> str:
    """This node in messages (SLURM's name for it: test clusters share one host)."""
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname()


def staged_name(source: Path) -> str:
    name = source.name
    for suffix in TAR_SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def data_root(target: Path) -> Path:
    """Where the data starts: a tar packed with one top folder (pets/train/...) unpacks
    into target/pets."""
    entries = list(target.iterdir())
    if len(entries) == 1 and entries[0].is_dir() and (entries[0] / "train").is_dir():
        return entries[0]
    return target


def listing(folder: Path) -> dict[str, int]:
    """Every regular file under `folder`: relative path -> size."""
    files = {}
    for parent, _, names in os.walk(folder):
        for name in names:
            path = Path(parent) / name
            files[str(path.relative_to(folder))] = path.stat().st_size
    return files


def first_difference(expected: dict[str, int], found: dict[str, int]) -> str | None:
    for name, size in expected.items():
        if found.get(name) != size:
            got = "missing" if name not in found else f"{found[name]} bytes"
            return f"{name}: {got}, expected {size} bytes"
    return None


def stamp_of(source: Path) -> dict:
    """What identifies the source: a tar by its size and time, a folder by its files."""
    if source.is_file():
        st = source.stat()
        return dict(source=str(source), size=st.st_size, mtime_ns=st.st_mtime_ns)
    return dict(source=str(source), files=listing(source))


def reusable(target: Path, manifest: Path, stamp: dict) -> dict | None:
    """The manifest of a complete earlier staging of this very source, else None."""
    try:
        recorded = json.loads(manifest.read_text())
    except (OSError, ValueError):
        return None
    same = {k: recorded.get(k) for k in stamp} == stamp
    if not same or not target.is_dir():
        return None
    return recorded if first_difference(recorded["files"], listing(target)) is None else None


def stage_once(source: Path, target: Path) -> str:
    """Stage `source` to `target` unless a complete staging is there; what was done."""
    started = time.perf_counter()
    manifest = target.with_name(target.name + ".manifest.json")
    stamp = stamp_of(source)
    if (recorded := reusable(target, manifest, stamp)) is not None:
        return (f"{node_name()}: reusing the staging of {source} in {target} "
                f"({len(recorded['files'])} files verified in "
                f"{time.perf_counter() - started:.1f} s)")
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.partial-{socket.gethostname()}-{os.getpid()}")
    try:
        expected = _copy(source, partial)
        problem = first_difference(expected, listing(partial))
        if problem:
            raise UsageError(f"the staged copy differs from the source ({problem})")
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    if target.exists():  # an incomplete or stale earlier staging
        shutil.rmtree(target)
    os.rename(partial, target)
    write_json(manifest, dict(stamp, files=expected))
    size = sum(expected.values())
    return (f"{node_name()}: staged {source} to {target} in "
            f"{time.perf_counter() - started:.1f} s ({len(expected)} files, "
            f"{size / 1e6:.1f} MB)")


def _copy(source: Path, partial: Path) -> dict[str, int]:
    """Copy or unpack into `partial`; the files the source holds (path -> size)."""
    if source.is_dir():
        expected = listing(source)
        shutil.copytree(source, partial)
        return expected
    try:
        with tarfile.open(source) as tar:
            tar.extractall(partial, filter="data")
            return {str(Path(m.name)): m.size for m in tar.getmembers() if m.isfile()}
    except tarfile.TarError as error:
        reason = str(error).splitlines()[0].rstrip(":")
        raise UsageError(f"{source} is not a readable tar file ({reason}); pack the image "
                         "folder with: tar -cf NAME.tar -C PARENT NAME") from None
