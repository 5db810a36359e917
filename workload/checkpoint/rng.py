"""The global random states a checkpoint carries, as plain tensors, lists and numbers.

Dropout draws from torch's global generator, so an exact resume needs it back; numpy and
python `random` are saved too for user code. Everything is converted to tensors (torch's
states are uint8 tensors, numpy's key an int64 tensor), numbers, strings and lists, so that
they go into rng.safetensors and rng.json (workload.checkpoint.formats).
"""

from __future__ import annotations

import hashlib
import random

import numpy as np
import torch

from workload.distributed import gather_objects


def local_states() -> dict:
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    version, internal, gauss_next = random.getstate()
    states = dict(
        torch=torch.get_rng_state(),
        numpy=dict(kind=kind, keys=torch.from_numpy(keys.astype(np.int64)), pos=int(pos),
                   has_gauss=int(has_gauss), cached=float(cached)),
        python=dict(version=version, internal=list(internal), gauss_next=gauss_next),
    )
    if torch.cuda.is_available():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def set_states(states: dict) -> None:
    torch.set_rng_state(states["torch"].cpu())
    n = states["numpy"]
    np.random.set_state((n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"],
                         n["has_gauss"], n["cached"]))
    p = states["python"]
    random.setstate((p["version"], tuple(p["internal"]), p["gauss_next"]))
    if "cuda" in states and torch.cuda.is_available():
        cuda = [s.cpu() for s in states["cuda"]]
        if len(cuda) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(cuda)


def derive_states(seed: int, step: int, rank: int) -> None:
    """Random states for a rank the checkpoint has none of (it was written by fewer
    ranks): torch (CPU and CUDA), numpy and python seeded from (seed, step, rank), the
    same in every run that resumes the same way."""
    digest = hashlib.sha256(f"{seed}:{step}:{rank}".encode()).digest()
    value = int.from_bytes(digest[:8], "little") >> 1
    torch.manual_seed(value)
    np.random.seed(value % 2**32)
    random.seed(value)


def gather_states(world_size: int) -> list[dict]:
    """Every rank's states, in rank order (a collective: all ranks must call it)."""
    return gather_objects(local_states(), world_size)
