"""Run `train`, recording the training samples each rank's loader yields, in order: one
short hash per image, per epoch, in RECORD.rank<N>.json.

    PYTHONPATH=. torchrun --nproc-per-node=2 tests/scripts/shard_sequence.py RECORD ...

(the checkout on PYTHONPATH: the hashes are tests/helpers/image_hashes.py's, which the test
computes too).
"""

from __future__ import annotations

import json
import os
import sys

from tests.helpers.image_hashes import image_hashes
from workload.data.loaders import TorchLoader
from workload.train import main

original_batches = TorchLoader.batches
seen: dict[int, list[str]] = {}


def recorded_batches(self, epoch: int, start: int = 0):
    for images, labels in original_batches(self, epoch, start):
        if self.train:
            seen.setdefault(epoch, []).extend(image_hashes(images))
            rank = os.environ.get("RANK", "0")
            with open(f"{sys.argv[1]}.rank{rank}.json", "w") as f:
                json.dump(seen, f)
        yield images, labels


if __name__ == "__main__":
    TorchLoader.batches = recorded_batches
    main(sys.argv[2:])
