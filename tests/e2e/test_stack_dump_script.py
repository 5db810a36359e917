"""A user's own script gets the on-demand stack dump through setup(): SIGUSR1 writes every
thread's Python stack into ./diagnostics/rank-<N>.txt, and the script goes on."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from tests.helpers import REPO, clean_env, wait_for

SCRIPT = """
import pathlib, time
from workload.launch import setup

me = setup()
pathlib.Path("ready").write_text(str(me.rank))

def wait_for_the_go():  # where the dump must show this script to be
    while not pathlib.Path("go").exists():
        time.sleep(0.05)

wait_for_the_go()
print("finished")
"""


def test_sigusr1_dumps_a_users_script_stacks_and_it_carries_on(tmp_path):
    (tmp_path / "mine.py").write_text(SCRIPT)
    log = tmp_path / "log.txt"
    with open(log, "w") as stream:
        script = subprocess.Popen([sys.executable, "mine.py"], cwd=tmp_path, stdout=stream,
                                  stderr=subprocess.STDOUT,
                                  env={**clean_env(), "PYTHONPATH": str(REPO)})
    try:
        wait_for(lambda: (tmp_path / "ready").exists(), "the script's setup()", log, 60)
        os.kill(script.pid, signal.SIGUSR1)
        dump = tmp_path / "diagnostics" / "rank-0.txt"
        wait_for(lambda: dump.exists() and "wait_for_the_go" in dump.read_text(),
                 "the stack dump", log, 30)
        (tmp_path / "go").write_text("")
        assert script.wait(timeout=60) == 0
    finally:
        script.kill()
    assert "finished" in log.read_text()
    assert 'File "' in dump.read_text() and "mine.py" in dump.read_text()
