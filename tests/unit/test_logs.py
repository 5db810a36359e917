"""Lines from several ranks that share one output stay whole lines.

The image sets PYTHONUNBUFFERED; under it print() writes a line's text and its newline in
two calls, so the lines of torchrun's workers (one pipe per node) interleave mid-line.
workload.logs.say writes each line in one call.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

from tests.helpers import REPO

LINES = 3000
WRITER = f"""
import sys
from workload.logs import say, warn
for i in range({LINES}):
    say(f"rank {{sys.argv[1]}} line {{i}} ok")
    warn("launch", f"rank {{sys.argv[1]}} line {{i}} ok")
"""


def test_two_ranks_writing_to_one_pipe_never_split_a_line():
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(REPO)}
    read, write = os.pipe()
    writers = [subprocess.Popen([sys.executable, "-c", WRITER, str(rank)], stdout=write,
                                stderr=write, env=env) for rank in (0, 1)]
    os.close(write)
    with os.fdopen(read) as pipe:
        text = pipe.read()
    assert [w.wait() for w in writers] == [0, 0]
    lines = text.splitlines()
    broken = [line for line in lines
              if not re.fullmatch(r"(launch: warning: )?rank [01] line \d+ ok", line)]
    assert not broken, broken[:5]
    assert len(lines) == 2 * 2 * LINES
