"""A pytest plugin that writes when each test phase ran, on which xdist worker, and the CPU
time it took, one JSON line each, to the file named by TEST_TIMELINE: the data for finding
the suite's critical path and its CPU (docs/development.md). The CPU time is the worker's
own and that of the processes it started and waited for; what SLURM's daemons start (the
jobs' ranks) is not in it. Load it with `-p tests.helpers.timeline`:

    make test PYTEST_ARGS="-p tests.helpers.timeline" TEST_TIMELINE=/tmp/timeline.jsonl
    python tools/timeline.py /tmp/timeline.jsonl
"""

from __future__ import annotations

import json
import os
import resource

_cpu_at_last_report = [0.0]


def cpu_so_far() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    waited = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + waited.ru_utime + waited.ru_stime


def pytest_runtest_logreport(report) -> None:
    path = os.environ.get("TEST_TIMELINE")
    if not path or not hasattr(report, "start"):
        return
    now = cpu_so_far()
    line = {"worker": os.environ.get("PYTEST_XDIST_WORKER", "main"), "test": report.nodeid,
            "phase": report.when, "start": report.start, "stop": report.stop,
            "outcome": report.outcome, "cpu_s": now - _cpu_at_last_report[0]}
    _cpu_at_last_report[0] = now
    with open(path, "a") as stream:  # one short append per line: whole under O_APPEND
        stream.write(json.dumps(line) + "\n")
