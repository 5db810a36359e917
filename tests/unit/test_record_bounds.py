"""Every number the package reads back from a file is held to its one table of bounds
(workload.config.bounds, issue 59 section 5): each reader below, fed each field it reads
past that field's bound, says so in one line (a skipped file, a warning, a usage error, a
damaged checkpoint) naming the field, and never raises anything else; every field of the
table has a reader here; and every module that parses JSON from a file is one of these
readers or named below with why its values need no bound, so a new reader without the
table fails this test."""

from __future__ import annotations

import json
import re

import pytest

from tests.helpers import REPO
from workload.config import RECORD_BOUNDS
from workload.errors import UsageError

DATA = {  # bytes of a line a valid reader takes, its fields replaced by each case
    "heartbeat": dict(rank=0, world_size=2, host="nid001", pid=100, step=8, phase="fwd",
                      time=1.7e9, median_step_s=0.5, stalled=False, attempt=1.7e9),
    "epoch": dict(epoch=1, train_loss=2.3, test_loss=2.2, accuracy=0.5,
                  images_per_second=900.0, lr=0.1, epoch_time_s=4.0, steps=6),
    "attempt": dict(time=1.7e9, job="7", status=1, ending="failure", started_from=4,
                    checkpointed=8, without_progress=0, verdict="", action="restart",
                    nodes=["nid001"], exclude=[], reasons=["a rank failed"]),
}


def past(key: str):
    """A value just past the bound of `key`: its high end doubled, else below its low."""
    bound = RECORD_BOUNDS[key].range
    value = bound.high * 2 + 1 if bound.high is not None else bound.low - 1
    return int(value) if RECORD_BOUNDS[key].whole else float(value)


def heartbeat(tmp_path, key, value):
    from workload.diagnose.records import Skipped, heartbeat

    with pytest.raises(Skipped) as skipped:
        heartbeat(json.dumps(DATA["heartbeat"] | {key: value}).encode(), 0)
    return str(skipped.value)


def startup(tmp_path, key, value):
    from workload.diagnose.records import Skipped, startup

    with pytest.raises(Skipped) as skipped:
        startup(json.dumps({"last_phase": "data", key: value}).encode(), 0)
    return str(skipped.value)


def flight(tmp_path, key, value):
    from workload.diagnose.records import Skipped, flight

    entry = {"collective_seq_id": value, "profiling_name": "gloo:all_reduce",
             "retired": False}
    with pytest.raises(Skipped) as skipped:
        flight(json.dumps({"entries": [entry]}).encode(), 0)
    return str(skipped.value)


def model_card() -> dict:
    return {"format": "hpc-train-model", "format_version": 1, "weights": "model.safetensors",
            "model": "wrn", "arguments": {"width": 8, "blocks_per_stage": 1, "dropout": 0.01,
                                          "stem": "small", "image_size": 16},
            "num_classes": 10, "classes": None, "dataset": "digits",
            "input": {"image_size": 16, "resize": "stretch", "mean": [0.5] * 3,
                      "std": [0.25] * 3}}


def model_json(tmp_path, key, value):
    from workload.models import read_description

    card = model_card()
    place = (card if key == "num_classes" else card["arguments"])
    place[key] = value
    (tmp_path / "model.json").write_text(json.dumps(card))
    with pytest.raises(UsageError) as refused:
        read_description(tmp_path / "model.json")
    return str(refused.value)


def model_input_size(tmp_path, key, value):
    from workload.models import read_description

    card = model_card()
    card["input"][key] = value
    (tmp_path / "model.json").write_text(json.dumps(card))
    with pytest.raises(UsageError) as refused:
        read_description(tmp_path / "model.json")
    return str(refused.value)


def metrics(tmp_path, key, value):
    from workload.report import epoch_problem

    return epoch_problem(DATA["epoch"] | {key: value})


def summary(tmp_path, key, value):
    from workload.report import read_summary
    from workload.runfolder import RunFolder

    (tmp_path / "summary.json").write_text(json.dumps({"device": "cpu", key: value}))
    kept = read_summary(RunFolder(tmp_path))
    assert key not in kept and kept["device"] == "cpu"
    return "left out"


def steps(tmp_path, key, value):
    from workload.report import step_records

    lines = [{"step": 10, key: 1.0}, {"step": 20, key: value}] if key != "step" else \
        [{"step": 10}, {"step": value}]
    (tmp_path / "steps.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    assert step_records(tmp_path / "steps.jsonl") == [lines[0]]
    return "left out"


def shard_manifest(tmp_path, key, value):
    from workload.data.shardformat import FORMAT, FORMAT_VERSION, manifest_problem

    entry = dict(name="train-000000.tar", samples=2, bytes=4096, sha256="0" * 64,
                 index=[0, 200])
    manifest = dict(format=FORMAT, format_version=FORMAT_VERSION, classes=["a", "b"],
                    splits={"train": {"shards": [entry | {key: value}]},
                            "val": {"shards": []}})
    return manifest_problem(manifest)


def trainer_state(tmp_path, key, value):
    from workload.checkpoint.content import check_loaded
    from workload.checkpoint.writer.durable import CorruptCheckpoint

    trainer = dict(schedule={}, scaler={}, epoch=1, batch=2, step=8, accuracies=[],
                   world_size=1) | {key: value}
    with pytest.raises(CorruptCheckpoint) as refused:
        check_loaded(tmp_path / "step-8", trainer, [{}], {})
    return str(refused.value)


def resumed_metrics(tmp_path, key, value):
    from workload.checkpoint.resuming import trim_metrics

    path = tmp_path / "metrics.jsonl"
    path.write_text(json.dumps({key: 1}) + "\n" + json.dumps({key: value}) + "\n")
    trim_metrics(path, epochs_done=1)
    assert path.read_text() == json.dumps({key: 1}) + "\n"
    return "dropped"


def previous_startup(tmp_path, key, value):
    from workload.training.startup import slower_phases

    assert slower_phases({"data": 95.0}, {"phases_s": {"data": value}}) == []
    return "not compared"


def lock_holder(tmp_path, key, value):
    from workload.checkpoint.lock import describe_holder, readable

    assert not readable({"host": "nid001", key: value})
    return describe_holder({"host": "nid001", key: value})


def attempt(tmp_path, key, value):
    from workload.diagnose.attempts import attempts
    from workload.runfolder import RunFolder

    line = dict(DATA["attempt"]) | {key: value}
    run = RunFolder(tmp_path / "run")
    run.root.mkdir(exist_ok=True)
    run.attempts.write_text(json.dumps(DATA["attempt"]) + "\n" + json.dumps(line) + "\n")
    kept, [left_out] = attempts(run)
    assert kept == [DATA["attempt"]]
    return left_out


# reader -> (how it is fed, the fields it reads, whether its line names the field)
READERS = {
    "diagnose: heartbeat-<N>.json": (heartbeat, ("time", "step", "world_size", "pid",
                                                  "median_step_s", "attempt"), True),
    "diagnose: startup-rank-<N>.json": (startup, ("at",), True),
    "diagnose: fr-rank-<N>.json": (flight, ("collective_seq_id",), False),
    "predict, evaluate: model.json arguments": (
        model_json, ("width", "blocks_per_stage", "dropout", "image_size", "num_classes"),
        True),
    "predict, evaluate: model.json input": (model_input_size, ("image_size",), True),
    "report: metrics.jsonl": (metrics, ("epoch", "train_loss", "test_loss", "accuracy",
                                        "images_per_second", "lr", "epoch_time_s"), True),
    "report: summary.json": (summary, ("images_per_second", "world_size"), False),
    "report: steps.jsonl": (steps, ("step", "gpu_power_w", "cpu_package_power_w"), False),
    "train: shard manifest.json": (shard_manifest, ("samples", "bytes"), True),
    "resume: checkpoint trainer.json": (trainer_state, ("step", "epoch", "batch",
                                                        "world_size"), True),
    "train --resume: metrics.jsonl rewritten": (resumed_metrics, ("epoch",), False),
    "train: the previous job's summary.json start-up": (previous_startup, ("phase_s",),
                                                        False),
    "train, Checkpoints: the run folder's lock": (lock_holder, ("pid",), False),
    "diagnose: attempts.jsonl": (attempt, ("time", "status", "started_from", "checkpointed",
                                           "without_progress"), True),
}
CASES = [(reader, key) for reader, (_, keys, _) in READERS.items() for key in keys]


@pytest.mark.parametrize("reader,key", CASES, ids=[f"{r}-{k}" for r, k in CASES])
def test_each_reader_says_a_value_past_its_bound_in_one_line(reader, key, tmp_path):
    feed, _, names = READERS[reader]
    for value in (past(key), -1 if RECORD_BOUNDS[key].range.low == 0 else 10**30, 1e20,
                  True, "7"):
        if not RECORD_BOUNDS[key].problem(value):
            continue  # within the bound (a negative time: not past it from above)
        line = feed(tmp_path, key, value)
        assert line and "\n" not in line, (value, line)
        if names:
            assert key in line, (value, line)


def test_a_time_no_clock_shows_is_past_every_time_field():
    """T5: a start-up record at 1e20 s ended diagnose in an OverflowError of gmtime."""
    for key in ("time", "at", "attempt"):
        assert RECORD_BOUNDS[key].problem(1e20)


def test_every_field_of_the_table_has_a_reader_here():
    walked = {key for _, keys, _ in READERS.values() for key in keys}
    assert walked == set(RECORD_BOUNDS), set(RECORD_BOUNDS) ^ walked


# Modules that parse JSON from a file and use a number of it; each is walked above.
WALKED = {"workload/diagnose/records.py", "workload/models/description.py",
          "workload/report.py", "workload/data/shardformat.py",
          "workload/checkpoint/content.py", "workload/checkpoint/lock.py",
          "workload/training/run.py", "workload/checkpoint/resuming.py",
          "workload/diagnose/attempts.py"}
# Modules that parse JSON and need no bound, with why.
NO_NUMBER_USED = {
    "workload/config/sources.py": "a --config file: every value goes through validate(), "
                                  "the config fields' bounds",
    "workload/data/staging.py": "a staging's manifest is compared whole with the one "
                                "computed from the source",
    "workload/data/shardwrite.py": "the owner and the earlier index lines are compared "
                                   "with what this write computes",
    "workload/checkpoint/writer/durable.py": "the JSON reader of checkpoints: its callers check",
    "workload/checkpoint/formats.py": "a part's data goes to check_fits against the live "
                                      "objects",
    "workload/checkpoint/writer/store.py": "a manifest's sizes are compared with the files'",
    "workload/checkpoint/writer/process.py": "its own safetensors header and the loop's requests "
                                     "over a pipe",
    "workload/checkpoint/background.py": "the writer process's replies over a pipe",
    "workload/checkpoint/loopargs.py": "a loop's own `extra`, parsed to check it",
    "workload/training/watchdog.py": "torch's flight recorder dump, in memory",
    "workload/files.py": "the JSON readers themselves",
    "workload/checkpoint/snapshot.py": "a shard's rank and world size are compared with "
                                       "the trainer state's, itself walked",
    "workload/bench/first_step.py": "the summary.json of the train it started itself, in "
                                    "a folder of its own",
    "workload/diagnose/preflight.py": "doctor's report: a rank is only matched with the "
                                      "report's own rank map, never sized or counted",
}
PARSES = re.compile(r"strict_json\(|read_json_file\(|read_jsonl_(records|lines)\(|"
                    r"read_json\(|json\.loads?\(")


def test_every_module_that_reads_json_is_walked_or_says_why_not():
    found = {path.relative_to(REPO).as_posix() for path in (REPO / "workload").rglob("*.py")
             if PARSES.search(path.read_text())}
    unplaced = found - WALKED - set(NO_NUMBER_USED)
    assert not unplaced, f"a reader of JSON outside the table's walk: {sorted(unplaced)}"
    assert not (WALKED | set(NO_NUMBER_USED)) - found, "a listed module reads no JSON now"
