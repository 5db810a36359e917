"""A short hash of each image of a batch: how tests/scripts/shard_sequence.py records the
samples each rank's loader yields, and how its test hashes one process's sequence."""

from __future__ import annotations

import hashlib


def image_hashes(images) -> list[str]:
    return [hashlib.sha256(image.contiguous().numpy().tobytes()).hexdigest()[:16]
            for image in images.cpu()]
