"""The requests the site test holds against the centre's figures: each training step's
and each job's, at the centre's scale, a line in requests.jsonl in the twin's state."""

from __future__ import annotations

import json
from pathlib import Path

from tests.twins.stand_ins.node import CONFIG


def record(entry: dict) -> None:
    """A request at the centre's scale, for the site test (requests.jsonl)."""
    with open(Path(CONFIG["state"]) / "requests.jsonl", "a") as requests:
        requests.write(json.dumps(entry) + "\n")


def trains(command: list[str]) -> bool:
    """A step whose tasks are training ranks: train, torchrun, a script, or the job
    scripts' check of that layout (LAUNCH_CHECK=1); not the data step, which only
    fetches."""
    check = [arg for arg in command if arg in ("workload.launch", "check")]
    return "--prepare-data" not in command and (check == ["workload.launch", "check"] or any(
        Path(arg).name in ("train", "torchrun") or arg.endswith(".py") for arg in command))
