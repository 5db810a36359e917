"""Run `train` in this process, then print this rank's parameter digest.

    torchrun --nproc-per-node=2 tests/scripts/rank_probe.py --dataset digits ...

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
from workload.training import run as training_run

captured = {}
save_model = training_run.save_model


def digest_then_save(cfg, data, model, out, write):
    # The trained model, while the process group that FSDP's shards need still stands.
    captured["digest"] = parameter_digest(model)
    save_model(cfg, data, model, out, write)


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
    training_run.save_model = digest_then_save
    training_run.run(parse_config(sys.argv[1:]))
    print(f"rank-digest {os.environ.get('RANK', '0')} {captured['digest']}", flush=True)


if __name__ == "__main__":
    main()
