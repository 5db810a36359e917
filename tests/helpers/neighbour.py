"""The neighbour of tests/e2e/test_neighbour.py and test_neighbour_swaps.py: another uid
whose primary group is the project's, switched to with setpriv (root only), running the
system's /usr/bin/python3 (it cannot reach the interpreter of the test environment, which
may live under root's home); and the victim, this test's uid running the installed
`train` with the umask 002 of a shared project."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.helpers import REPO, clean_env

NEIGHBOUR, GROUP = 65531, 65531
TRAIN = str(Path(sys.executable).parent / "train")
PRECIOUS = b"the victim's own file, outside the run\n"


def project_folders():
    """top/project: the group's folder (2775, setgid); top/victim: the victim's private
    files (0700), each `precious-*` one a target for the neighbour's links."""
    top = Path(tempfile.mkdtemp(prefix="hpc-train-neighbour-", dir="/var/tmp"))
    top.chmod(0o755)
    (top / "project").mkdir()
    os.chown(top / "project", 0, GROUP)
    (top / "project").chmod(0o2775)
    (top / "victim").mkdir(mode=0o700)
    yield top
    shutil.rmtree(top)


def run_folder(top: Path) -> Path:
    """The victim's run folder, made by an earlier job with the project's umask 002."""
    run = top / "project" / "run"
    run.mkdir()
    run.chmod(0o2775)
    return run


def precious(top: Path, name: str) -> Path:
    path = top / "victim" / f"precious-{name}"
    path.write_bytes(PRECIOUS)
    path.chmod(0o600)
    return path


def neighbour(script: str, *args: str) -> subprocess.CompletedProcess:
    """`script` run by /usr/bin/python3 as the neighbour (sys.argv[1:] = args)."""
    done = subprocess.run(["setpriv", f"--reuid={NEIGHBOUR}", f"--regid={GROUP}",
                           "--clear-groups", "/usr/bin/python3", "-c", script, *args],
                          env={"PATH": "/usr/bin:/bin", "HOME": "/nonexistent"},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done


# The neighbour's part: links at the given names (folders made as needed, group-writable).
PLANT_LINKS = """
import os, sys
os.umask(0o002)
for pair in sys.argv[1:]:
    name, target = pair.split("=", 1)
    os.makedirs(os.path.dirname(name), mode=0o2775, exist_ok=True)
    os.symlink(target, name)
"""


def as_neighbour(script: str, *args: str) -> subprocess.Popen:
    return subprocess.Popen(["setpriv", f"--reuid={NEIGHBOUR}", f"--regid={GROUP}",
                             "--clear-groups", "/usr/bin/python3", "-c", script, *args],
                            env={"PATH": "/usr/bin:/bin", "HOME": "/nonexistent"},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def victim_train(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    """`train` as the victim, held until a line arrives on its stdin (so the neighbour
    knows its PID, as `ps` tells anyone, before it starts); `env`: added variables."""
    return subprocess.Popen(["sh", "-c", 'read go && exec "$@"', "sh", TRAIN, *args],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, umask=0o002, cwd=REPO,
                            env={**clean_env(), **(env or {})})


def finish(proc: subprocess.Popen) -> tuple[int, str]:
    out, _ = proc.communicate("go\n", timeout=600)
    return proc.returncode, out
