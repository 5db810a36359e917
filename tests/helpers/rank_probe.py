"""Run `train` in this process, then print this rank's parameter digest.

    torchrun --nproc-per-node=2 tests/helpers/rank_probe.py --dataset digits ...

summary.json holds rank 0's digest only; the distributed tests need every rank's, over
the parameters alone (BatchNorm running statistics are per-rank by design under DDP).
"""

from __future__ import annotations

import hashlib
import os
import sys

import torch

from workload import distributed
from workload.train import parse_config
from workload.training.run import run

captured = {}
wrap_model = distributed.wrap_model


def capture(model, info, strategy):
    captured["model"] = wrap_model(model, info, strategy)
    return captured["model"]


def parameter_digest(model) -> str:
    digest = hashlib.sha256()
    for name, param in distributed.unwrap(model).named_parameters():
        tensor = param.detach()
        if hasattr(tensor, "full_tensor"):  # an FSDP2 shard: gather the whole parameter
            tensor = tensor.full_tensor()
        tensor = tensor.cpu().contiguous()
        digest.update(name.encode() + tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def main() -> None:
    distributed.wrap_model = capture
    try:
        run(parse_config(sys.argv[1:]))
        digest = parameter_digest(captured["model"])
        print(f"rank-digest {os.environ.get('RANK', '0')} {digest}", flush=True)
    finally:
        distributed.teardown()


if __name__ == "__main__":
    main()
