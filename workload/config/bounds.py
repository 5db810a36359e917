"""The one table of bounds of every number the package reads back from a file it (or a
job of it) wrote: diagnostics (heartbeats, start-up marks), run files (metrics.jsonl,
steps.jsonl, summary.json, attempts.jsonl and bad-nodes.jsonl), model.json, shard
manifests and index lines, checkpoints' trainer state. A file from disk is data: a value
past its bound (a time of 1e20, which no clock shows and `time.gmtime` cannot convert) is
one line naming the field, the value and its bound, never a traceback further on.

A field is named the same in every record that holds it (a `step` is a step everywhere);
a field that is one of train's settings (model.json's `width`) takes the bounds of its
config field (schema.py), so a record holds only what train accepts.
"""

from __future__ import annotations

from dataclasses import dataclass

from workload.config.schema import FIELDS, MIN_IMAGE_SIZE
from workload.config.values import Range

MAX_COUNT = 2**62          # steps and batches: ranks agree on them in an int64
MAX_BYTES = 1 << 50        # a file's size or a byte offset in it (1 PiB), inside off_t
MAX_RANKS = 1 << 20        # a world size or rank beyond this is not a real job's
MAX_PID = 1 << 22          # Linux's PID_MAX_LIMIT
DAY_S = 86_400.0
# A wall-clock time (seconds since 1970) a record holds: before 2200. Beyond, no clock of
# a job shows it, and converting it to a date overflows.
TIMES = Range(0.0, 7_258_118_400.0)
FLOAT32_MAX = 3.4028234663852886e38  # a loss torch computed is a float32 at most


@dataclass(frozen=True)
class Bound:
    """What a field may hold: a whole number or any finite number, within `range`; None
    too where `null` (a NaN or infinite value a writer stored as null)."""
    whole: bool
    range: Range
    null: bool = False

    def problem(self, value) -> str:
        """What `value` must be ("" when it may be this field's)."""
        if value is None and self.null:
            return ""
        kinds = (int,) if self.whole else (int, float)
        if isinstance(value, bool) or not isinstance(value, kinds):
            return "a whole number" if self.whole else "a number"
        return self.range.problem(value)


def _setting(key: str, low=None) -> Bound:
    """A train setting's bound (its config field's), from `low` up where given."""
    field = FIELDS[key]
    bounds = field.metadata["bounds"]
    return Bound(field.type in (int, "int"), Range(bounds.low if low is None else low,
                                                   bounds.high, bounds.low_open and low is None,
                                                   bounds.high_open))


_COUNT = Bound(True, Range(0, MAX_COUNT))
_SECONDS = Bound(False, Range(0.0, 366 * DAY_S))
_RATE = Bound(False, Range(0.0, 1e12))
_POWER = Bound(False, Range(0.0, 1e7), null=True)  # watts: a whole cluster's is below

RECORD_BOUNDS: dict[str, Bound] = {
    # diagnostics/heartbeat-<N>.json and startup-rank-<N>.json
    "time": Bound(False, TIMES), "at": Bound(False, TIMES),
    "attempt": Bound(False, Range(0.0, TIMES.high)),  # rank 0's clock at the start, or 0
    "step": _COUNT, "world_size": Bound(True, Range(1, MAX_RANKS)),
    "pid": Bound(True, Range(1, MAX_PID)),
    "median_step_s": Bound(False, Range(0.0, 7 * DAY_S), null=True),
    "collective_seq_id": Bound(True, Range(0, MAX_COUNT), null=True),  # fr-rank-<N>.json
    # metrics.jsonl, summary.json
    "epoch": Bound(True, Range(0, 10**9)),
    "train_loss": Bound(False, Range(0.0, FLOAT32_MAX), null=True),
    "test_loss": Bound(False, Range(0.0, FLOAT32_MAX), null=True),
    "accuracy": Bound(False, Range(0.0, 1.0), null=True),
    "images_per_second": _RATE, "lr": Bound(False, Range(0.0, 1e6)),
    "epoch_time_s": _SECONDS, "phase_s": _SECONDS,  # summary.json: a start-up phase's
    # steps.jsonl
    "gpu_power_w": _POWER, "cpu_package_power_w": _POWER,
    # model.json: the model's arguments and input are train's settings
    "width": _setting("width"), "blocks_per_stage": _setting("blocks_per_stage"),
    "dropout": _setting("dropout"), "num_classes": _setting("num_classes"),
    "image_size": _setting("image_size", low=MIN_IMAGE_SIZE),
    # shard manifests' entries (a shard's samples: at most --shard-size's most)
    "samples": _setting("shard_size", low=0), "bytes": Bound(True, Range(0, MAX_BYTES)),
    # checkpoints' trainer state
    "batch": _COUNT,
    # attempts.jsonl (diagnose): a job step's exit status, the steps its attempt started
    # from and checkpointed, the attempts in a row without a new checkpoint
    "status": Bound(True, Range(0, 255)),
    "started_from": Bound(True, Range(0, MAX_COUNT), null=True),
    "checkpointed": Bound(True, Range(0, MAX_COUNT), null=True),
    "without_progress": _COUNT,
}


def out_of_range(key: str, value) -> str:
    """Why `value` cannot be the field `key` of a record, in words ("" when it can, or
    when the table has no such field)."""
    bound = RECORD_BOUNDS.get(key)
    problem = bound.problem(value) if bound else ""
    return f"{key} {_short(value)} is not {problem}" if problem else ""


def record_problem(record: dict, keys=None) -> str:
    """The first field of `record` (of `keys`, else of every field the table has) that is
    out of its bound, in words ("" when none is). A field missing is not this check's."""
    for key in RECORD_BOUNDS if keys is None else keys:
        if key in record and (problem := out_of_range(key, record[key])):
            return problem
    return ""


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:40] + "..."
