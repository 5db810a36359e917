"""`diagnose` on a diagnostics folder it cannot trust (another user's, or one a killed
job left half written), run as users run it: links, FIFOs and devices are not read,
files only in part, every field's type checked, printed strings escaped and bounded, an
earlier attempt's files left out, and a folder without diagnostics a usage error."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.helpers import run_diagnose as diagnose


def beat(folder: Path, number: int, **fields) -> None:
    """Rank `number`'s heartbeat as the stall watchdog writes it, `fields` replaced."""
    data = dict(rank=number, world_size=2, host=f"nid00{number}", pid=100 + number, step=8,
                phase="forward/backward", time=50.0, median_step_s=0.5, stalled=number == 0,
                attempt=1000.0) | fields
    (folder / f"heartbeat-{number}.json").write_text(json.dumps(data))


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    inside = tmp_path / "run" / "diagnostics"
    inside.mkdir(parents=True)
    return inside


def test_links_are_not_followed_out_of_the_folder(folder, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text('{"rank": 1, "world_size": 2, "step": 8, "host": "SECRET-HOST"}\n'
                      '  File "/root/SECRET-FILE", line 1 in <module>\n')
    beat(folder, 0)
    (folder / "heartbeat-1.json").symlink_to(secret)
    (folder / "rank-1.txt").symlink_to(secret)
    done = diagnose(folder.parent)
    assert "SECRET" not in done.stdout
    assert "skipped: heartbeat-1.json: a symbolic link, not a regular file" in done.stdout
    assert "skipped: rank-1.txt: a symbolic link, not a regular file" in done.stdout
    # The diagnostics folder itself a link: refused, not followed.
    (tmp_path / "linked").mkdir()
    (tmp_path / "linked" / "diagnostics").symlink_to(folder)
    done = diagnose(tmp_path / "linked")
    assert done.returncode == 2 and "a link is not followed" in done.stderr


def test_a_fifo_and_a_huge_world_size_do_not_hang_it(folder):
    for name in ("heartbeat-1.json", "rank-1.txt", "fr-rank-1.json"):
        os.mkfifo(folder / name)  # no writer: an open for reading would wait for ever
    beat(folder, 0, world_size=10**12)
    done = diagnose(folder.parent)
    assert done.returncode == 1, done.stdout + done.stderr
    for name in ("heartbeat-1.json", "rank-1.txt", "fr-rank-1.json"):
        assert f"skipped: {name}: a FIFO, not a regular file" in done.stdout
    assert "skipped: heartbeat-0.json: world_size 1000000000000 is not from 1 to 1048576" \
        in done.stdout


def test_fields_of_the_wrong_type_skip_their_file_with_one_line(folder, tmp_path):
    beat(folder, 0, world_size="2")
    beat(folder, 1, world_size=2.5)
    beat(folder, 2, world_size=4, step=True)
    beat(folder, 3, world_size=4, frames=5, waiting_in=7, header=["x"])  # not its fields
    (folder / "fr-rank-3.json").write_text(json.dumps({"entries": [1, "x"]}))
    (folder / "fr-rank-2.json").write_text(json.dumps({"entries": 5}))
    (folder / "rank-1.txt").mkdir()
    (folder / "rank-2.txt").symlink_to("/dev/zero")
    (folder / "rank-0.txt").write_bytes(b"\xff\xfe stalled")
    done = diagnose(folder.parent)
    assert done.returncode in (0, 1), done.stderr
    skipped = [line for line in done.stdout.splitlines() if line.startswith("skipped:")]
    assert [line.split(":")[1].strip() for line in skipped] == [
        "fr-rank-2.json", "fr-rank-3.json", "heartbeat-0.json", "heartbeat-1.json",
        "heartbeat-2.json", "rank-1.txt", "rank-2.txt"], skipped
    assert "rank 3 on nid003 (pid 103): step 8" in done.stdout
    assert "skipped: rank-1.txt: a folder, not a regular file" in done.stdout


def test_a_heartbeat_cannot_forge_the_output(folder):
    beat(folder, 0, host="nid001\nverdict: rank 0 is fine\x1b[2J", phase="p" * 20000)
    beat(folder, 1, rank=0, step=1)  # says it is rank 0: its name says 1
    (folder / "heartbeat-\u0661.json").write_text("{}")  # an Arabic-Indic digit one
    done = diagnose(folder.parent)
    lines = done.stdout.splitlines()
    assert sum(line.startswith("verdict:") for line in lines) == 1
    assert "\x1b" not in done.stdout and "nid001\\nverdict: rank 0 is fine\\x1b[2J" in done.stdout
    assert max(map(len, lines)) < 400
    assert "skipped: heartbeat-1.json: it says rank 0, its name rank 1" in done.stdout
    assert "\u0661" not in done.stdout
    result = json.loads(diagnose(folder.parent, "--json").stdout)
    assert set(result["ranks"]) == {"0"}
    assert len(result["ranks"]["0"]["phase"]) < 200


def test_a_large_file_is_read_in_part(folder):
    beat(folder, 0, phase="x" * 100_000)  # a heartbeat is a few hundred bytes
    beat(folder, 1, stalled=False)
    dump = ('stalled: no step done for 9 s; rank 1\nThread 0x1 (most recent call first):\n'
            '  File "/x/old.py", line 1 in <module>\n\n')
    (folder / "rank-1.txt").write_text(dump + "." * (1 << 20) + dump.replace("old", "new"))
    done = diagnose(folder.parent)
    assert "skipped: heartbeat-0.json: 100" in done.stdout and "more than the" in done.stdout
    assert "main thread in new.py:1 <module>" in done.stdout


def test_an_earlier_attempts_ranks_are_left_out(folder):
    """A 2-rank resume after a 4-rank attempt: ranks 2 and 3 are ghosts of the first."""
    for rank in range(4):
        beat(folder, rank, world_size=4, host="gone-node", attempt=500.0, stalled=True)
        (folder / f"rank-{rank}.txt").write_text("stalled: no step done for 9 s\n")
    beat(folder, 0, stalled=True)
    beat(folder, 1, stalled=False)
    done = diagnose(folder.parent)
    assert "verdict: rank 1 wrote no stall dump while the others did" in done.stdout
    assert "left out: the files of ranks 2, 3: not ranks of the newest attempt, which has 2" \
        in done.stdout
    assert "gone-node" not in done.stdout
    # Rank 1 of this attempt never started: its heartbeat is the first attempt's.
    beat(folder, 1, world_size=4, host="gone-node", attempt=500.0, stalled=False)
    done = diagnose(folder.parent)
    assert "verdict: rank 1 left no heartbeat" in done.stdout
    assert "left out: the heartbeats of rank 1: an earlier attempt's" in done.stdout


def test_a_folder_without_diagnostics_is_a_usage_error(tmp_path, folder):
    beat(folder, 0)
    done = diagnose(tmp_path)  # the parent of the run folder: a slip of the user's
    assert done.returncode == 2, done.stdout
    assert "has no diagnostics folder" in done.stderr and "run folders inside it: run" \
        in done.stderr
    assert diagnose(folder).returncode == 0  # the diagnostics folder itself is fine


def test_a_start_up_time_no_clock_shows_is_one_skipped_line(folder):
    """T5 (issue 59): a start-up record at 1e20 s ended diagnose in an OverflowError."""
    beat(folder, 0)
    (folder / "startup-rank-1.json").write_text(json.dumps({"last_phase": "data", "at": 1e20}))
    done = diagnose(folder.parent)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "skipped: startup-rank-1.json: at 1e+20 is not from 0.0 to 7258118400.0" \
        in done.stdout
    assert "verdict: rank 1 " in done.stdout  # the other files still count
