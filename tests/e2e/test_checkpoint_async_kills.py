"""Kill -9 during `train`'s asynchronous saves (the default): of the training process, and
separately of its background writer, at random moments. Every resume starts from a
committed checkpoint (the one `latest` names, whose files are the uninterrupted run's of
that step, byte for byte), and each chain's last run ends bit-identical with the
uninterrupted run.

`train` processes (forked from a server that imported torch once,
tests/helpers/forked_train.py: 23 fresh interpreters would spend minutes importing it on 2
cores), a checkpoint after every step, so the writer is nearly always busy and a kill
lands mid-save. Two chains run side by side, one killing the training process and one
killing the writer; each run of a chain resumes from what the killed one left and is
killed in turn. A kill of the training process kills its writer too (the parent-death
signal); a kill of the writer stops the run with one line. The
random moments come from a seeded generator; its seed is in every assertion's message:
HPC_TRAIN_KILL_SEED=N replays a failure.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.helpers import TINY, started_writer_of
from tests.helpers.forked_train import start_train
from workload.checkpoint.writer.folder import complete_steps, latest_step

pytestmark = pytest.mark.slow

# 10 epochs of 8 steps on 128 tiny images; a checkpoint after every step, all kept, so
# every committed step can be compared with the uninterrupted run's.
ARGS = [*TINY, "--dataset", "synthetic", "--synthetic-size", "128", "--image-size", "16",
        "--num-classes", "4", "--batch-size", "16", "--epochs", "10", "--seed", "3",
        "--checkpoint-every", "1", "--keep-checkpoints", "100"]
TRIALS = 10  # per chain: 20 kills in all
HANDED = re.compile(r"checkpoint \(\w[\w ]*\) at step (\d+): \S+ handed to the writer")
RESUMED = re.compile(r"resumed from (\S+): step (\d+),")
# What the uninterrupted run saved at the same step: the model and the optimizer (Python's
# random state differs between fresh runs, which never draw from it, and trainer.json
# holds the energy each run measured).
SAVED = ("model.safetensors", "optimizer.safetensors", "optimizer.json")


def start(out: Path) -> tuple:
    """A run of ARGS in `out` and its log (one per run, beside the run folder)."""
    logs = out.with_name(f"{out.name}-logs")
    logs.mkdir(exist_ok=True)
    log = logs / f"run-{len(list(logs.iterdir()))}.log"
    log.touch()
    return start_train([*ARGS, "--output-dir", str(out)], log), log


def handed_over(proc, log: Path, step: int) -> bool:
    """Until a save of `step` or later was handed to the writer; False if the run ended."""
    while proc.is_alive():
        steps = [int(m.group(1)) for m in HANDED.finditer(log.read_text())]
        if steps and max(steps) >= step:
            return True
        time.sleep(0.005)
    return False


def finished(proc, log: Path) -> str:
    proc.join(600)
    return log.read_text()


def fingerprints(root: Path) -> dict[int, str]:
    """Each committed step's state (the timeline up to `latest`), as one digest."""
    head = latest_step(root)
    return {step: hashlib.sha256(b"".join((path / name).read_bytes() for name in SAVED))
            .hexdigest() for step, path in complete_steps(root)
            if head is not None and step <= head}


def gone(pid: int | None, seconds: float = 60) -> bool:
    deadline = time.monotonic() + seconds
    while pid is not None and Path(f"/proc/{pid}").exists():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def kill_once(out: Path, victim: str, rng: random.Random, seed: int) -> dict:
    """One run of a chain, SIGKILLed (`victim`: the training process or its writer) a
    random moment after its second or third save was handed to the writer."""
    root = out / "checkpoints"
    before = latest_step(root)
    # From the second save on: the hand-over of a step waits for the one before to be
    # committed, so the writer is up (imported) and writing when the kill comes.
    (proc, log), target = start(out), (before or 0) + rng.randint(2, 3)
    running = handed_over(proc, log, target)
    time.sleep(rng.uniform(0, 0.05))
    where = f"seed {seed}, {victim} kill after step {target}"
    assert running and proc.is_alive(), f"{where}: the run ended first:\n{log.read_text()}"
    writer = started_writer_of(proc.pid)
    os.kill(proc.pid if victim == "train" else writer, signal.SIGKILL)
    text = finished(proc, log)
    assert gone(writer), f"{where}: the writer {writer} did not exit:\n{text[-3000:]}"
    if victim == "writer":
        assert proc.exitcode == 2, f"{where}: exit status {proc.exitcode}:\n{text[-3000:]}"
        assert "the checkpoint writer process died (killed by signal 9)" in text, text[-3000:]
    return {"before": before, "text": text, "where": where, "committed": fingerprints(root)}


def chain(out: Path, victim: str, seed: int) -> tuple[list[dict], str]:
    """TRIALS killed runs, then one that ends: what each left, the last one's model."""
    rng = random.Random(f"{seed}-{victim}")
    trials = [kill_once(out, victim, rng, seed) for _ in range(TRIALS)]
    before, (proc, log) = latest_step(out / "checkpoints"), start(out)
    text = finished(proc, log)
    trials.append({"before": before, "text": text,
                   "where": f"seed {seed}, {victim} chain's last run", "committed": {}})
    assert proc.exitcode == 0, f"seed {seed}: {victim} chain's last run:\n{text[-3000:]}"
    return trials, json.loads((out / "summary.json").read_text())["model_sha256"]


def uninterrupted(out: Path) -> tuple[dict[int, str], str]:
    proc, log = start(out)
    text = finished(proc, log)
    assert proc.exitcode == 0, text[-3000:]
    assert text.count("checkpoint staging buffer:") == 1, text  # its size, printed once
    summary = json.loads((out / "summary.json").read_text())
    return fingerprints(out / "checkpoints"), summary["model_sha256"]


def resumed_from(text: str) -> int | None:
    found = RESUMED.search(text)
    return int(found.group(2)) if found else None


def test_kills_of_train_and_of_its_writer_resume_from_committed_bit_exact(tmp_path):
    seed = int(os.environ.get("HPC_TRAIN_KILL_SEED") or random.randrange(10**6))
    with ThreadPoolExecutor(3) as pool:
        reference = pool.submit(uninterrupted, tmp_path / "reference")
        chains = [pool.submit(chain, tmp_path / victim, victim, seed)
                  for victim in ("train", "writer")]
        steps, final = reference.result()
        for done in chains:
            trials, model = done.result()
            for trial, following in zip(trials, trials[1:]):
                where = trial["where"]
                for step, digest in trial["committed"].items():
                    assert digest == steps[step], f"{where}: committed step {step} differs"
                start_step = resumed_from(following["text"])
                # The next run resumes from exactly what `latest` named (none: step 0).
                assert start_step == following["before"], (
                    f"{where}: resumed from {start_step}, `latest` named "
                    f"{following['before']}\n{following['text'][-3000:]}")
            assert model == final, f"seed {seed}: {trials[-1]['where']} ended otherwise"
