"""How long a checkpoint save blocks training, synchronous and asynchronous, against
writing the same bytes.

Builds the reference Wide ResNet's training state (model and SGD momentum, about 137 MB
for the default width), then times, in one process, each round:

  save      the checkpoint as train writes it (workload.checkpoint's save_checkpoint:
            serialise, write, fsync, manifest, rename): the loop is blocked throughout;
  async     the same state saved by workload.checkpoint.Checkpoints(async_save=True):
            the time its save() blocks (the copy into the staging buffer) and the time
            until the writer process has committed the checkpoint (save() to wait());
  train     train's own saves (workload.checkpoint.Checkpointer, the snapshot included),
            with --no-checkpoint-async (blocked until committed) and with
            --checkpoint-async, its default (blocked, and until the writer committed);
  baseline  the same files' bytes, already serialised, written and fsynced.

in a shuffled order each round (so that none always follows the same one), and prints
the median of each and the ratios to the bare I/O. The writer process starts in the
warm-up round. A shared disk's times vary widely: use many rounds (--repeats 15).

    python tools/bench_checkpoint_save.py                     # the reference model
    python tools/bench_checkpoint_save.py --width 16 --repeats 3   # a quick look
    python tools/bench_checkpoint_save.py --dir /scratch/$USER    # on another disk
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch

from workload.checkpoint import Checkpointer, Checkpoints, save_checkpoint, take_snapshot
from workload.config import TrainConfig
from workload.distributed import DistInfo
from workload.launch import PreemptionFlag
from workload.runfolder import RunFolder
from workload.training.build import build_state


def training_state(width: int):
    """The state after one step, so the optimizer holds its momentum buffers."""
    cfg = TrainConfig.from_flat({"model": "wrn", "width": width, "device": "cpu"})
    info = DistInfo.alone(torch.device("cpu"))
    state = build_state(cfg, info, num_classes=100, steps_per_epoch=10, precision="fp32")
    loss = state.model(torch.randn(2, 3, 32, 32)).sum()
    loss.backward()
    state.optimizer.step()
    return cfg, state


def timed_save(root: Path, snapshot) -> float:
    start = time.perf_counter()
    save_checkpoint(root, snapshot, keep=1, is_main=True)
    return time.perf_counter() - start


def timed_async(ckpt: Checkpoints, state, step: int) -> tuple[float, float]:
    """(blocked, committed): seconds until save() returned, and until wait() did."""
    start = time.perf_counter()
    ckpt.save(step, model=state.model, optimizer=state.optimizer, scheduler=state.schedule)
    blocked = time.perf_counter() - start
    ckpt.wait()
    return blocked, time.perf_counter() - start


def checkpointer(cfg, state, out: Path, async_save: bool) -> Checkpointer:
    cfg = cfg.replace(checkpoint_async=async_save, keep_checkpoints=1)
    return Checkpointer(cfg, DistInfo.alone(torch.device("cpu")), state, RunFolder(out), 10,
                        PreemptionFlag(), num_classes=100)


def timed_train(saver: Checkpointer, state, step: int) -> tuple[float, float]:
    """(blocked, committed): train's save at a new step, and until it is committed."""
    state.step = step
    start = time.perf_counter()
    saver.save("bench")
    blocked = time.perf_counter() - start
    saver.session.settle()
    return blocked, time.perf_counter() - start


def timed_write(folder: Path, contents: dict[str, bytes]) -> float:
    """Write and fsync each file, then the folder: the least any durable save must do."""
    folder.mkdir()
    start = time.perf_counter()
    for name, data in contents.items():
        with open(folder / name, "wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    os.fsync(fd)
    os.close(fd)
    return time.perf_counter() - start


def saved_bytes(step_folder: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted(step_folder.iterdir())
            if path.is_file()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--width", type=int, default=TrainConfig().model.width,
                        help="Wide ResNet width (default: train's)")
    parser.add_argument("--repeats", type=int, default=5, help="timed rounds of each")
    parser.add_argument("--dir", default=None, help="where to write (default: a temp folder)")
    args = parser.parse_args()
    cfg, state = training_state(args.width)
    snapshot = take_snapshot(state, cfg.to_dict(), world_size=1, sharded=False)
    work = Path(tempfile.mkdtemp(prefix="bench-save-", dir=args.dir))
    try:
        first = work / "first"
        timed_save(first, snapshot)  # warm-up; its files are the baseline's bytes
        contents = saved_bytes(next(p for p in first.iterdir() if p.name.startswith("step-")))
        times: dict[str, list] = {"saves": [], "writes": [], "asyncs": [],
                                  "train_sync": [], "train_async": []}
        with Checkpoints(work / "async", keep=1, async_save=True) as ckpt, \
                checkpointer(cfg, state, work / "train-sync", False) as sync, \
                checkpointer(cfg, state, work / "train-async", True) as background:
            timed_async(ckpt, state, 0)  # warm-up: starts the writer, sizes the buffer
            timed_train(background, state, 0)  # the same for train's writer
            runs = {"saves": lambda n: timed_save(work / f"save-{n}", snapshot),
                    "asyncs": lambda n: timed_async(ckpt, state, n),
                    "train_sync": lambda n: timed_train(sync, state, n),
                    "train_async": lambda n: timed_train(background, state, n),
                    "writes": lambda n: timed_write(work / f"write-{n}", contents)}
            for round_ in range(args.repeats):
                # In a shuffled order each round, each starting with nothing of the one
                # before left to write back (os.sync): the operation right after a
                # synchronous save took up to 3 times as long on the development
                # machine's disk, whichever it was.
                for name, timed in random.Random(round_).sample(sorted(runs.items()), len(runs)):
                    os.sync()
                    times[name].append(timed(round_ + 1))
        report(contents, times, args)
    finally:
        shutil.rmtree(work)


def report(contents: dict[str, bytes], times: dict[str, list], args) -> None:
    size = sum(len(data) for data in contents.values()) / 1e6
    write = statistics.median(times["writes"])
    rows = [("save_checkpoint: blocked", times["saves"]),
            ("Checkpoints async: blocked", [b for b, _ in times["asyncs"]]),
            ("Checkpoints async: committed", [c for _, c in times["asyncs"]]),
            ("train sync: blocked", [b for b, _ in times["train_sync"]]),
            ("train async: blocked", [b for b, _ in times["train_async"]]),
            ("train async: committed", [c for _, c in times["train_async"]]),
            ("write + fsync, same bytes", times["writes"])]
    print(f"checkpoint of the Wide ResNet (width {args.width}): {len(contents)} files, "
          f"{size:.1f} MB; median of {args.repeats} rounds")
    for label, values in rows:
        median = statistics.median(values)
        print(f"{label:30}{median:7.3f} s   (min {min(values):.3f}, max {max(values):.3f})"
              f"   {median / write:5.2f}x the write")


if __name__ == "__main__":
    main()
