"""The background writer's half of an asynchronous save, in this process: the files it
serializes from the staging buffer (torch-free) are byte for byte those of a synchronous
save of the same snapshot, whatever the tensors' dtypes."""

from __future__ import annotations

from functools import partial

import torch

from workload.checkpoint.background import Stage
from workload.checkpoint.inprocess import write_checkpoint as commit
from workload.checkpoint.writer.store import MANIFEST, Snapshot, verify
from workload.checkpoint.writer.folder import complete_steps
from workload.checkpoint.writer.process import Buffer
from workload.checkpoint.writer.process import _save as _commit


def snapshot(step: int) -> Snapshot:
    model = {"w": torch.arange(12, dtype=torch.float32).reshape(3, 4),
             "half": torch.full((5,), 0.5, dtype=torch.bfloat16),
             "count": torch.tensor(7, dtype=torch.int64), "empty": torch.zeros(0)}
    optimizer = {"state": {0: {"momentum_buffer": torch.ones(3, 4)}},
                 "param_groups": [{"lr": 0.1, "params": [0]}]}
    trainer = dict(step=step, epoch=0, batch=step, world_size=1, scale=float("inf"))
    return Snapshot(model, optimizer, trainer, [{"torch": torch.get_rng_state()}],
                    {"seed": 1, "name": "x"})


def answered(answers: list, saved) -> None:
    """The writer's answer: where the checkpoint is, and the steps its folder then holds."""
    answers.append((saved, [step for step, _ in complete_steps(saved.parent)]))


def test_the_writer_writes_the_files_of_a_synchronous_save(tmp_path):
    stage, buffer = Stage(), Buffer()
    try:
        for step in (1, 2):  # the second save reuses the buffer (mapped once)
            request = stage.copy_in(snapshot(step))
            staged = tmp_path / "async" / "checkpoints"
            staged.mkdir(parents=True, exist_ok=True)
            tmp = staged / f".tmp-{step}"
            tmp.mkdir()
            request.update(root=str(staged), tmp=str(tmp), keep=1)
            # Committed first, pruned after the answer: step 1 goes only then.
            answers = []
            _commit(request, buffer, partial(answered, answers))
            assert answers == [(staged / f"step-{step:09d}", [*range(1, step + 1)])]
            assert [s for s, _ in complete_steps(staged)] == [step]
            plain = tmp_path / "sync" / "checkpoints"
            plain.mkdir(parents=True, exist_ok=True)
            (plain / ".tmp").mkdir()
            expected = commit(plain, plain / ".tmp", snapshot(step))
            files = verify(expected)["files"]
            assert verify(staged / expected.name)["files"] == files
            for name in files:
                assert (staged / expected.name / name).read_bytes() == \
                    (expected / name).read_bytes(), name
            assert MANIFEST not in files and "model.safetensors" in files
    finally:
        buffer.close()
        stage.drop()
