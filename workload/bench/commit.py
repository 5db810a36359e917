"""`bench commit`: a checkpoint's commit against a bare write and fsync of the same bytes,
on the disk where the run folder would be.

The commit is what every save does once its files' bytes exist (the synchronous save's
after serialising; the writer process's likewise from its staging buffer): the private
`.tmp-step-N` folder made and held, every file written, the manifest last, their fsyncs
and the folder's (workload.checkpoint.writer.store's `finish_checkpoint`), the rename into
place, `latest` replaced, checkpoints/ fsynced (workload.checkpoint.writer.folder's `publish`).
The baseline is the least any durable save of those bytes must do: the same bytes
written into one new file and fsynced. The two alternate in a shuffled
order each round, each after `os.sync()` (nothing of the one before left to write back),
and the table gives their medians and the commit's ratio to the write: the commit's fixed
cost (its files, fsyncs, renames and folder syncs) is what the ratio shows above 1. A
third row times the sha256 of the same bytes (the manifest's), which the commit takes
beside its writes: where it is longer than the write (a slow or busy CPU), it bounds the
commit rather than the disk does.

The state is split as the Wide ResNet's is (half the bytes in model.safetensors, half in
optimizer.safetensors: SGD's momentum, plus the small JSON files and the random states);
its bytes are random (a compressing file system would write zeros in no time). Older
steps are removed between rounds, outside the timing, as the pruning is after the commit.

    bench commit                                # 137 MB (the Wide ResNet's state), 9 rounds
    bench commit --size-mb 137 --rounds 15 --dir /scratch/$USER --json commit.json
"""

from __future__ import annotations

import hashlib
import os
import random
import shutil
import statistics
import tempfile
import time
from functools import partial
from pathlib import Path

from workload.checkpoint.writer.diskfull import DISK_FULL
from workload.checkpoint.writer.folder import step_name
from workload.checkpoint.writer.store import finish_checkpoint
from workload.errors import UsageError
from workload.held import let_go, make_held

# The reference Wide ResNet's checkpoint (width 160: model and SGD momentum), in MB.
WRN_STATE_MB = 137.5
# The small files of a checkpoint beside the two large ones, with about their sizes.
SMALL_FILES = {"optimizer.json": 20_000, "trainer.json": 1_000, "rng.safetensors": 10_000,
               "rng.json": 10_000, "config.json": 2_000}


def state_files(size_mb: float, seed: int = 0) -> dict[str, bytes]:
    """A checkpoint's files of about `size_mb` MB (1e6 bytes), random bytes."""
    rng = random.Random(seed)
    half = max(int(size_mb * 1e6) // 2, 1)
    files = {"model.safetensors": rng.randbytes(half),
             "optimizer.safetensors": rng.randbytes(half)}
    files.update({name: rng.randbytes(size) for name, size in SMALL_FILES.items()})
    return files


def timed_commit(root: Path, step: int, files: dict[str, bytes]) -> float:
    """Seconds a save's commit of `files` takes in `root` (as a save in the trainer: its
    temporary folder made and held, then finish_checkpoint)."""
    head = dict(step=step, epoch=0, batch=step, sharded=False, world_size=1)
    start = time.perf_counter()
    tmp = make_held(root / f".tmp-{step_name(step)}")
    try:
        finish_checkpoint(tmp, root / step_name(step), files.items(), head)
    finally:
        let_go(tmp)
    return time.perf_counter() - start


def timed_write(path: Path, files: dict[str, bytes]) -> float:
    """Seconds to write every file's bytes into the one new file `path` and fsync it."""
    start = time.perf_counter()
    with open(path, "xb") as file:
        for data in files.values():
            file.write(data)
        file.flush()
        os.fsync(file.fileno())
    return time.perf_counter() - start


def timed_hash(files: dict[str, bytes]) -> float:
    """Seconds to take the sha256 of every file's bytes, one after another in one thread:
    what the commit computes besides the write (its manifest), on as many cores as it has
    large files (a CPU-starved machine's commit is bound by it, not by its fsyncs)."""
    start = time.perf_counter()
    for data in files.values():
        hashlib.sha256(data).hexdigest()
    return time.perf_counter() - start


def measure(work: Path, files: dict[str, bytes], rounds: int) -> dict[str, list[float]]:
    """Both, `rounds` times each (and once before, untimed), in a shuffled order each
    round, each after os.sync(); the previous round's folders removed untimed."""
    root = work / "checkpoints"
    root.mkdir()
    times: dict[str, list[float]] = {"commit": [], "write": [], "hash": []}
    for number in range(rounds + 1):
        runs = {"commit": partial(timed_commit, root, number, files),
                "write": partial(timed_write, work / f"write-{number}", files),
                "hash": partial(timed_hash, files)}
        for name in random.Random(number).sample(sorted(runs), len(runs)):
            os.sync()
            seconds = runs[name]()
            if number:  # the first round warms the caches and the imports up
                times[name].append(seconds)
        (work / f"write-{number}").unlink()
        if number:
            shutil.rmtree(root / step_name(number - 1))
    return times


def run(args: dict) -> dict:
    from workload.bench.common import print_table, write_report

    files = state_files(args["size_mb"])
    total = sum(len(data) for data in files.values())
    work = Path(tempfile.mkdtemp(prefix="bench-commit-", dir=args["dir"]))
    try:
        times = measure(work, files, args["rounds"])
    except OSError as error:
        if error.errno not in DISK_FULL:
            raise
        raise UsageError(f"--dir {args['dir']} filled up during bench commit "
                         f"({os.strerror(error.errno)}); its temporary folder is removed; "
                         "free space (or inodes), or pass --dir on a disk with room") from None
    finally:
        shutil.rmtree(work, ignore_errors=True)
    commit, write, hashed = (statistics.median(times[name]) for name in ("commit", "write",
                                                                         "hash"))
    ratios = [c / w for c, w in zip(times["commit"], times["write"])]
    print(f"bench commit: {len(files)} files, {total / 1e6:.1f} MB in {args['dir']}; "
          f"medians of {args['rounds']} rounds")
    print_table(["operation", "median s", "min s", "max s", "x the write"],
                [["commit (files, fsyncs, renames)", commit, min(times["commit"]),
                  max(times["commit"]), commit / write],
                 ["write + fsync, same bytes", write, min(times["write"]),
                  max(times["write"]), 1.0],
                 ["sha256 of the same bytes", hashed, min(times["hash"]), max(times["hash"]),
                  hashed / write]])
    print(f"commit / write: {commit / write:.2f}x (medians); per round: "
          f"{', '.join(f'{r:.2f}' for r in ratios)}")
    results = {"bytes": total, "files": len(files), "commit_s": times["commit"],
               "write_s": times["write"], "commit_median_s": commit,
               "write_median_s": write, "hash_s": times["hash"], "hash_median_s": hashed,
               "ratio": commit / write, "round_ratios": ratios}
    write_report(args["json"], "commit", {k: v for k, v in args.items() if k != "json"},
                 results)
    return results
