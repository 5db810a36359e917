"""`--stage-to DIR`: the dataset copied (a folder) or unpacked (a `.tar`, `.tar.gz`) to
node-local storage such as $SLURM_TMPDIR, once per node, before the loaders open it.

Local rank 0 of each node stages; the node's other ranks wait for it (a gloo group with a
long timeout, so a copy longer than --dist-timeout is no failure) and every rank learns of
any node's failure, or of a preemption signal that stopped a node's copy (every rank then
exits with the requeue status).

Each state of a source has its own staging, `DIR/<name>-<id>` (in a DIR others may write
under the sticky bit, a node's /tmp: in this user's private `DIR/hpc-train-stage-<uid>`;
a DIR others may write without it is refused: staging.own_folder), the id made from the
source's identity (stagefiles.identity), with `DIR/<name>-<id>.manifest.json` written
before the copy is renamed into place. A job holds a shared lock on `DIR/.<name>-<id>.lock`
for as long as it runs; a later job whose source has changed stages a new copy and removes
the older stagings of the same source that no live job holds. `train` removes nothing it
did not make: a folder without its manifest is refused. Copies go to a private folder
first, so two stagers on one folder cannot mix their files, and a killed or stopped copy
never looks complete (a killed one's is removed by the next stager: stagefiles.py). That
folder is made by mkdtemp (a name no one can foresee, mode 0700), so a link planted in a
shared node-local folder cannot take the copy elsewhere.

A shard folder (`--dataset shards`) is staged by the same rules, its files being those
its manifest names (the manifest, each shard and its indexes): the folder is not listed,
its identity is made from those files alone, and a folder that is not a complete shard
folder is refused before anything is copied. The ranks then read the staged manifest,
without listing the staging either.
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import torch.distributed as dist

from workload.config import TrainConfig
from workload.data import shardformat
from workload.data.stagefiles import (NoLocks, StagingStopped, copy_in, first_difference,
                                      hold_shared, identity, let_go, listing, lock_path,
                                      partial_prefix, remove_dead_partials,
                                      remove_if_unused, staged_name)
from workload.distributed import DistInfo
from workload.errors import UsageError
from workload.files import (open_to_group, private_folder_problem, read_json_file, shared_sticky,
                            swappable_parent, unwritable_reason, write_json)
from workload.launch.preemption import (REQUEUE_EXIT_STATUS, PreemptionFlag,
                                        exit_for_requeue)
from workload.launch.variables import node_name
from workload.logs import logger

WAIT_FOR_STAGING = timedelta(hours=6)  # how long the other ranks wait for a node's copy
_held: dict[Path, int] = {}  # the locks of the stagings this process uses, held until it ends


def stage_data(cfg: TrainConfig, info: DistInfo, flag: PreemptionFlag | None = None) -> str:
    """The data folder to read: the staged copy with --stage-to, else --data-dir."""
    if not cfg.data.stage_to:
        return cfg.data.data_dir
    source = Path(cfg.data.data_dir).expanduser().resolve()
    stage_dir = Path(cfg.data.stage_to).expanduser().resolve()
    shards = cfg.data.dataset == "shards"
    status = None
    if info.local_rank == 0:
        status = _stage_status(source, stage_dir, flag, shards)
    statuses = [s for s in _gather(status, info) if s is not None]
    for failed in (s for s in statuses if s["failed"]):
        raise UsageError(failed["text"])
    for stopped in (s for s in statuses if s["stopped"]):
        if info.is_main:
            logger.warning(f"{stopped['text']}; exiting with status {REQUEUE_EXIT_STATUS} "
                           "so the job script requeues the job")
        exit_for_requeue(0, stopped["stopped"])  # every rank: none waits for the others
    for s in statuses:
        logger.info(s["text"])
    target = Path(_node_status(statuses)["staging"])
    return str(target if shards else data_root(target))  # a shard folder: no listing


def _stage_status(source: Path, stage_dir: Path, flag: PreemptionFlag | None,
                  shards: bool) -> dict:
    """What this node's stager did, for every rank: done, failed (why) or stopped."""
    status = dict(node=node_name(), failed=False, stopped=None)
    try:
        # a shard folder: the files its manifest names (an incomplete one is refused here)
        names = shardformat.folder_files(shardformat.read_manifest(source)) if shards else None
        target, status["text"] = stage_once(source, stage_dir, flag, names)
        status["staging"] = str(target)
    except StagingStopped as stop:
        status.update(stopped=stop.signal_name,
                      text=f"{node_name()}: {stop}; no partial copy is left")
    except (UsageError, OSError) as error:
        status.update(failed=True, text=f"staging {source} to {stage_dir} failed: {error}")
    return status


def _node_status(statuses: list[dict]) -> dict:
    """What this node's stager did (the node's other ranks read the staging it names)."""
    return next(s for s in statuses if s["node"] == node_name())


def _gather(status: dict | None, info: DistInfo) -> list:
    if info.world_size == 1 or not dist.is_initialized():
        return [status]
    group = dist.new_group(backend="gloo", timeout=WAIT_FOR_STAGING)
    gathered: list = [None] * info.world_size
    dist.all_gather_object(gathered, status, group=group)
    return gathered


def data_root(target: Path) -> Path:
    """Where the data starts: a tar packed with one top folder (pets/train/...) unpacks
    into target/pets."""
    entries = list(target.iterdir())
    if len(entries) == 1 and entries[0].is_dir() and (entries[0] / "train").is_dir():
        return entries[0]
    return target


def manifest_of(target: Path) -> Path:
    return target.with_name(target.name + ".manifest.json")


def read_manifest(target: Path) -> dict | None:
    """The manifest that says `target` is a staging made by train, else None."""
    try:  # a regular file of a bounded size: the node-local folder may be shared
        recorded = read_json_file(manifest_of(target), shardformat.MAX_MANIFEST_BYTES)
    except (OSError, ValueError):
        return None
    if not isinstance(recorded, dict) or recorded.get("staging") != target.name:
        return None
    return recorded if isinstance(recorded.get("files"), dict) else None


def stage_once(source: Path, stage_dir: Path, flag: PreemptionFlag | None = None,
               names: list[str] | None = None) -> tuple[Path, str]:
    """The staging of this state of `source` in `stage_dir` (made unless a complete one is
    there, and locked for this process's life); what was done. `names`: the only files
    of the source folder to copy (a shard folder's), else all of them."""
    key = identity(source, flag, names)
    if problem := unwritable_reason(stage_dir, create=True):  # made here
        raise UsageError(f"--stage-to cannot be written ({problem}); pass a folder you can "
                         "write to, such as $SLURM_TMPDIR")
    target = own_folder(stage_dir) / f"{staged_name(source)}-{key[:16]}"
    lock = lock_path(target)
    if lock not in _held:
        _held[lock] = hold_shared(lock)
    try:
        text = _reuse_or_stage(source, target, key, flag, _held[lock], names)
    except BaseException:
        let_go(target, _held.pop(lock))
        raise
    return target, "; ".join([text, *remove_older(source, target)])


def own_folder(stage_dir: Path) -> Path:
    """Where this user's stagings live in `stage_dir`: the folder itself when only this
    user may write it, else (others may, under the sticky bit of a node's /tmp) this
    user's private subfolder `hpc-train-stage-<uid>` (mode 0700), where no one else can
    have put a staging, a manifest or a lock (a name and a manifest made from `stat`
    alone can be forged); a fresh one for this job when that name is someone else's. A
    folder others may write without the sticky bit, or one inside such a folder, is
    refused: they could rename anything written there and put theirs in its place."""
    if swappable := swappable_parent(stage_dir):
        raise UsageError(f"--stage-to {stage_dir}: {swappable}; pass a folder only you may "
                         "write (such as $SLURM_TMPDIR) or one with the sticky bit (a "
                         "node's /tmp)")
    if not shared_sticky(stage_dir):
        return stage_dir
    own = stage_dir / f"hpc-train-stage-{os.getuid()}"
    problem = private_folder_problem(own, close_looser=False)
    if problem is None:
        return own
    fresh = Path(tempfile.mkdtemp(dir=stage_dir, prefix=f"{own.name}-"))
    logger.warning(f"--stage-to: {problem}; staging into {fresh} for this job alone")
    return fresh


def _reuse_or_stage(source: Path, target: Path, key: str, flag: PreemptionFlag | None,
                    mine: int | None, names: list[str] | None) -> str:
    started = time.perf_counter()
    recorded = read_manifest(target)
    if recorded is None and os.path.lexists(target):
        raise UsageError(f"{target} exists but was not made by --stage-to (no "
                         f"{manifest_of(target).name} beside it naming it), and train "
                         "replaces only its own stagings: move that folder away, or pass "
                         "another --stage-to folder")
    if (recorded is not None and recorded.get("identity") == key and target.is_dir()
            and first_difference(recorded["files"], listing(target)) is None):
        return (f"{node_name()}: reusing the staging of {source} in {target} "
                f"({len(recorded['files'])} files verified in "
                f"{time.perf_counter() - started:.1f} s)")
    return _stage_anew(source, target, key, flag, mine, started, names)


def _stage_anew(source: Path, target: Path, key: str, flag: PreemptionFlag | None,
                mine: int | None, started: float, names: list[str] | None) -> str:
    dead = remove_dead_partials(target, mine)
    if os.path.lexists(target):  # ours, but damaged (a file of it deleted)
        if mine is None:  # no locks to tell whether another job reads it: replaced
            shutil.rmtree(target)
        elif not remove_if_unused(target, mine):
            raise UsageError(f"the staging {target} is incomplete and another job on this "
                             "node reads it; wait for that job to end, or pass another "
                             "--stage-to folder")
    # A private folder (0700) of a name no one can foresee: a node-local folder may be
    # shared, and a link planted at a name known in advance took the copy elsewhere
    # (then became the staging); no one can put a link inside it for the copy to follow.
    partial = Path(tempfile.mkdtemp(dir=target.parent, prefix=f"{partial_prefix(target)}"
                                    f"{socket.gethostname()}-{os.getpid()}-"))
    try:
        expected = copy_in(source, partial, flag, names)
        problem = first_difference(expected, listing(partial))
        if problem:
            raise UsageError(f"the staged copy differs from the source ({problem})")
        # The manifest first: a folder named like a staging without one is not train's.
        write_json(manifest_of(target), dict(source=str(source), staging=target.name,
                                             identity=key, files=expected))
        open_to_group(partial)  # readable as mkdir would have made it, as it takes its place
        os.rename(partial, target)
    except OSError:
        shutil.rmtree(partial, ignore_errors=True)
        if not (target.is_dir() and read_manifest(target)):
            raise
        return f"{node_name()}: {source} was staged to {target} by another job meanwhile"
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    size = sum(expected.values())
    return (f"{node_name()}: staged {source} to {target} in "
            f"{time.perf_counter() - started:.1f} s ({len(expected)} files, "
            f"{size / 1e6:.1f} MB)" + "".join(
                f"; removed the partial copy {name}, left by a stager that ended before it "
                "was done" for name in dead))


def remove_older(source: Path, target: Path) -> list[str]:
    """Remove the older stagings of `source` beside `target` that no live job holds."""
    said = []
    prefix = f"{staged_name(source)}-"
    for manifest in sorted(target.parent.glob(f"{prefix}*.manifest.json")):
        older = manifest.with_name(manifest.name[: -len(".manifest.json")])
        recorded = read_manifest(older)
        if older == target or recorded is None or recorded.get("source") != str(source):
            continue
        if _held.get(lock_path(older)) is not None:  # this process staged it, moved on
            os.close(_held.pop(lock_path(older)))
        try:
            removed = remove_if_unused(older)
        except NoLocks:
            said.append(f"kept the older staging {older.name}: {older.parent} has no file "
                        "locks (flock) to tell whether a job reads it; remove it when none does")
            continue
        said.append(f"removed the older staging {older.name}" if removed else
                    f"kept the older staging {older.name}: another job reads it")
    return said
