"""A pytest plugin that writes when each test phase ran and on which xdist worker, one JSON
line each, to the file named by TEST_TIMELINE: the data for finding the suite's critical
path (docs/development.md#the-suites-time). Load it with `-p tests.helpers.timeline`:

    make test PYTEST_ARGS="-p tests.helpers.timeline" TEST_TIMELINE=/tmp/timeline.jsonl
    python tools/timeline.py /tmp/timeline.jsonl
"""

from __future__ import annotations

import json
import os


def pytest_runtest_logreport(report) -> None:
    path = os.environ.get("TEST_TIMELINE")
    if not path or not hasattr(report, "start"):
        return
    line = {"worker": os.environ.get("PYTEST_XDIST_WORKER", "main"), "test": report.nodeid,
            "phase": report.when, "start": report.start, "stop": report.stop,
            "outcome": report.outcome}
    with open(path, "a") as stream:  # one short append per line: whole under O_APPEND
        stream.write(json.dumps(line) + "\n")
