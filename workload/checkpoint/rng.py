"""The global random states a checkpoint carries, as plain tensors, lists and numbers.

Dropout draws from torch's global generator, so an exact resume needs it back; numpy and
python `random` are saved too for user code. Everything is converted to tensors (torch's
states are uint8 tensors, numpy's key an int64 tensor), numbers, strings and lists, so that
they go into rng.safetensors and rng.json (workload.checkpoint.formats).
"""

from __future__ import annotations

import hashlib
import math
import random

import numpy as np
import torch

from workload.distributed import gather_objects

KEYS = ("torch", "numpy", "python")  # and "cuda" where CUDA was there


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


def _numpy_state(n: dict) -> tuple:
    return (n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"],
            n["cached"])


def _python_state(p: dict) -> tuple:
    return (p["version"], tuple(p["internal"]), p["gauss_next"])


def _is_number(value, low: float, high: float) -> bool:
    return type(value) in (int, float) and low <= value <= high


def check_states(states) -> None:
    """ValueError saying what is wrong when `states` (one rank's, read from a checkpoint)
    cannot be set. The forms are tried on throwaway generators (the global ones are
    untouched); what they do not check is checked here first (numpy takes a position past
    its 624 keys without a word and then crashes the process)."""
    if not (isinstance(states, dict) and all(k in states for k in KEYS)):
        raise ValueError(f"not a dictionary of random states ({', '.join(KEYS)})")
    n, t = states["numpy"], states["torch"]
    if not (isinstance(t, torch.Tensor) and t.dtype == torch.uint8 and t.dim() == 1):
        raise ValueError("torch's state is not a uint8 tensor")
    keys = n.get("keys") if isinstance(n, dict) else None
    if not (isinstance(keys, torch.Tensor) and keys.dtype == torch.int64
            and keys.shape == (624,) and 0 <= int(keys.min()) <= int(keys.max()) < 2**32):
        raise ValueError("numpy's state has no 624 keys of 32 bits")
    if not (_is_number(n.get("pos"), 0, 624) and n.get("has_gauss") in (0, 1)
            and _is_number(n.get("cached"), -math.inf, math.inf)):
        raise ValueError("numpy's state has a position, has_gauss or cached value out of range")
    try:
        torch.Generator().set_state(t)
        np.random.RandomState().set_state(_numpy_state(n))
        random.Random().setstate(_python_state(states["python"]))
    except (KeyError, TypeError, ValueError, OverflowError, RuntimeError,
            AttributeError) as error:
        raise ValueError(f"a state torch, numpy or python cannot take ({str(error)[:120]})"
                         ) from None
    _check_cuda(states.get("cuda", []))


def _check_cuda(cuda) -> None:
    """CUDA states: uint8 tensors, of the size this torch's generators take where there
    are GPUs (set_states applies them only then)."""
    if not (isinstance(cuda, list) and all(isinstance(c, torch.Tensor) and c.dtype == torch.uint8
                                           and c.dim() == 1 for c in cuda)):
        raise ValueError("the CUDA states are not a list of uint8 tensors")
    if cuda and torch.cuda.is_available():
        size = torch.cuda.get_rng_state().shape
        if any(c.shape != size for c in cuda):
            raise ValueError(f"the CUDA states are not of {size[0]} bytes each")


def set_states(states: dict) -> None:
    torch.set_rng_state(states["torch"].cpu())
    np.random.set_state(_numpy_state(states["numpy"]))
    random.setstate(_python_state(states["python"]))
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
