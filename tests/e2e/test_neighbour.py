"""A neighbour in the same project group, with write access to the run folder (a project
folder is group-writable, setgid, mode 2775, by design) or to a node folder, against the
victim's `train`: links planted at the names of train's temporary files, a symbolic link
at a file it appends to, a checkpoint planted in the node-local tier, names swapped
under the compile cache's archive while it is read, a link at the archive's temporary.
Each attack must be refused or harmless: no file of the victim's outside the run written,
no planted checkpoint resumed, no file of the neighbour's unpacked into the victim's
Inductor cache.

The victim is this test's uid running the installed commands (`train`, and the compile
cache's class in a process of its own) with the umask 002 of a shared project; the
neighbour is another uid whose primary group is the project's, switched to with setpriv
(root only), running the system's /usr/bin/python3 (it cannot reach the interpreter of
the test environment, which may live under root's home)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import CHECKPOINT_ARGS, REPO, clean_env, write_image_folder
from tests.helpers.neighbour import (GROUP, PLANT_LINKS, PRECIOUS, as_neighbour, finish,
                                     neighbour, precious, project_folders, run_folder,
                                     victim_train)
from workload.checkpoint.local import local_root

pytestmark = [pytest.mark.root, pytest.mark.slow]


@pytest.fixture
def project():
    yield from project_folders()


# The neighbour's part: links planted inside every save's folder that appears, until the
# file `stop` exists; how many were planted.
WATCH_SAVES = """
import os, sys, time
run, target, stop = sys.argv[1:4]
planted, end = 0, time.monotonic() + 600
while not os.path.exists(stop) and time.monotonic() < end:
    folder = os.path.join(run, "checkpoints")
    for name in os.listdir(folder) if os.path.isdir(folder) else []:
        if name.startswith(".tmp-step-"):
            try:
                os.symlink(target, os.path.join(folder, name, "model.safetensors"))
                planted += 1
            except OSError:
                pass
    time.sleep(0.001)
print(planted)
"""


def test_links_at_trains_temporary_files_write_nothing_outside_the_run(project):
    """The names train writes through, predictable before this change: the lock's draft
    (host and PID), each JSON record's `.<name>.tmp`, the final model's, `latest`'s
    (PID), the start-up record in diagnostics/."""
    run = run_folder(project)
    proc = victim_train(*CHECKPOINT_ARGS, "--max-steps", "4", "--no-checkpoint-async",
                        "--output-dir", str(run))
    pid, host = proc.pid, socket.gethostname()
    names = {f".train.lock.{host}.{pid}": "lock", ".config.json.tmp": "config",
             ".summary.json.tmp": "summary", ".model.json.tmp": "model-json",
             ".model.safetensors.tmp": "model", f"checkpoints/.latest.tmp-{pid}": "latest",
             "diagnostics/.startup-rank-0.json.tmp": "startup",
             "diagnostics/rank-0.txt": "stacks"}
    targets = {name: precious(project, why) for name, why in names.items()}
    neighbour(PLANT_LINKS, *(f"{run / name}={target}" for name, target in targets.items()))
    targets["inside a save"] = precious(project, "inside-a-save")
    watcher = as_neighbour(WATCH_SAVES, str(run), str(targets["inside a save"]),
                           str(project / "stop"))
    code, out = finish(proc)
    (project / "stop").touch()
    planted, _ = watcher.communicate(timeout=60)
    assert code == 0, out[-3000:]
    written = [name for name, target in targets.items()
               if target.read_bytes() != PRECIOUS or target.stat().st_mode & 0o077]
    # Both: the files written through the links, and the links planted in a save's folder.
    assert (written, planted.strip()) == ([], "0"), out[-2000:]
    assert (run / "summary.json").is_file() and not (run / "summary.json").is_symlink()
    assert (run / "checkpoints" / "latest").read_text() == "step-000000004\n"


def test_a_link_at_a_record_train_appends_to_is_refused_in_one_line(project):
    run = run_folder(project)
    target = precious(project, "metrics")
    neighbour(PLANT_LINKS, f"{run / 'metrics.jsonl'}={target}")
    code, out = finish(victim_train(*CHECKPOINT_ARGS, "--max-steps", "8", "--output-dir",
                                    str(run)))  # an epoch: before, its line was appended
    assert target.read_bytes() == PRECIOUS, out[-3000:]
    assert code == 2, out[-3000:]
    [line] = [line for line in out.splitlines() if line.startswith("train: error:")]
    assert f"{run / 'metrics.jsonl'} is a symbolic link" in line and "remove it" in line


# The neighbour's part: files of theirs (mode 0664) at the given names.
PLANT_FILES = """
import os, sys
os.umask(0o002)
for name in sys.argv[1:]:
    with open(name, "x") as f:
        f.write("the neighbour's own file\\n")
"""


def test_a_shard_rewrite_removes_none_of_the_neighbours_files(project):
    """A shard folder in the project folder: the neighbour's files at the names a rewrite
    with another --shard-size removes (a shard past the new count, a first-format index)
    were deleted with the victim's own stale shard."""
    source = write_image_folder(project / "victim" / "src", classes=1, per_class=8, size=8)
    dest = project / "project" / "shards"

    def prepare(size: str) -> None:
        code, out = finish(victim_train("--dataset", "imagefolder", "--data-dir", str(source),
                                        "--prepare-data", "--shards", str(dest),
                                        "--shard-size", size))
        assert code == 0, out[-3000:]

    prepare("4")  # two shards a split
    theirs = [dest / "train-000005.tar", dest / "val-000000.idx"]
    neighbour(PLANT_FILES, *map(str, theirs))
    prepare("8")  # one: the victim's train-000001.tar is stale
    assert all(path.read_text() == "the neighbour's own file\n" for path in theirs)
    assert not (dest / "train-000001.tar").exists()


# The neighbour's part: a checkpoint of theirs planted as the tier's newest for the run.
PLANT_TIER = """
import os, shutil, sys
os.umask(0o002)
tier, step = sys.argv[1], sys.argv[2]
os.makedirs(tier, mode=0o2775)
shutil.copytree(step, os.path.join(tier, os.path.basename(step)))
with open(os.path.join(tier, "latest"), "w") as f:
    f.write(os.path.basename(step) + "\\n")
"""


@pytest.mark.parametrize("mode", [0o1777, 0o2775], ids=["sticky-like-tmp", "group-writable"])
def test_a_checkpoint_planted_in_the_node_local_tier_is_never_resumed(project, mode):
    """--checkpoint-local on a node folder others may write: the neighbour makes the
    tier's folder for the victim's run (its name is predictable) and puts a checkpoint
    there, newer than the run folder's none."""
    donor = project / "project" / "donor"  # any run of the same settings; here the victim's
    code, out = finish(victim_train(*CHECKPOINT_ARGS, "--max-steps", "2",
                                    "--output-dir", str(donor)))
    assert code == 0, out[-3000:]
    node = project / "node"
    node.mkdir()
    os.chown(node, 0, GROUP)
    node.chmod(mode)
    run = project / "project" / "run"
    tier = local_root(str(node), run)
    theirs = shutil.copytree(donor / "checkpoints" / "step-000000002",
                             project / "theirs" / "step-000000002")  # as their own run's
    for path in [theirs.parent, theirs, *theirs.iterdir()]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    neighbour(PLANT_TIER, str(tier), str(theirs))
    code, out = finish(victim_train(*CHECKPOINT_ARGS, "--max-steps", "2", "--checkpoint-local",
                                    str(node), "--output-dir", str(run)))
    assert "resumed from" not in out, out[-3000:]
    assert code == 2 and "Traceback" not in out, out[-3000:]
    [line] = [line for line in out.splitlines() if line.startswith("train: error:")]
    assert line.startswith(f"train: error: --checkpoint-local {node}: "), line
    assert not (run / "checkpoints").exists()


# The victim's part of the compile cache's tests: the real class, in a process of its own.
VICTIM_CACHE = """
import os, sys, shutil, tarfile, torch
from pathlib import Path
from workload.runfolder import RunFolder
from workload.training.compile_cache import CompileCache
run, caches, action = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(caches / "inductor")
os.environ["TRITON_CACHE_DIR"] = str(caches / "triton")
(caches / "inductor" / "fx").mkdir(parents=True, exist_ok=True)
(caches / "inductor" / "fx" / "mine").write_bytes(b"the victim's kernel")
cache = CompileCache(RunFolder(run), torch.device("cpu"), is_main=True)
print(cache.path.name, os.getpid(), flush=True)
sys.stdin.readline()
if action == "save":
    cache.save()
else:
    evil = 0
    for _ in range(int(action)):
        shutil.rmtree(caches / "inductor" / "fx", ignore_errors=True)
        try:
            cache.read()
        except (OSError, ValueError, tarfile.TarError):  # refused, or caught mid-swap
            pass
        evil += (caches / "inductor" / "fx" / "evil").exists()
    print("evil", evil)
"""


def victim_cache(run: Path, caches: Path, action: str) -> tuple[subprocess.Popen, str, int]:
    proc = subprocess.Popen([sys.executable, "-c", VICTIM_CACHE, str(run), str(caches),
                             action], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, umask=0o002, cwd=REPO,
                            env=clean_env())
    name, pid = proc.stdout.readline().split()
    return proc, name, int(pid)


def test_a_link_at_the_compile_caches_temporary_is_not_followed(project):
    """Before: the archive was written to `.<name>.<pid>`, through a planted link, and
    then made world-readable by path (chmod 0644)."""
    run = run_folder(project)
    proc, name, pid = victim_cache(run, project / "victim" / "caches", "save")
    target = precious(project, "cache")
    neighbour(PLANT_LINKS, f"{run / f'.{name}.{pid}'}={target}")
    out, err = proc.communicate("go\n", timeout=120)
    assert proc.returncode == 0, err
    assert target.read_bytes() == PRECIOUS and target.stat().st_mode & 0o077 == 0
    assert (run / name).is_file() and not (run / name).is_symlink()


# The neighbour's part: their own archive swapped in and out under the victim's name.
SWAP = """
import io, os, sys, tarfile, time
os.umask(0o022)
run, name = sys.argv[1], sys.argv[2]
evil, good, spare = (os.path.join(run, n) for n in ("evil.tar", "good.tar", "spare.tar"))
with tarfile.open(evil, "w") as tar:
    info = tarfile.TarInfo("inductor/fx/evil")
    data = b"the neighbour's code"
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))
path = os.path.join(run, name)
end = time.monotonic() + float(sys.argv[3])
while time.monotonic() < end:  # the victim's file and the neighbour's trade places
    os.rename(path, good)
    os.rename(evil, path)
    os.rename(path, evil)
    os.rename(good, path)
"""


def test_names_swapped_under_the_compile_cache_never_unpack_the_neighbours_file(project):
    """The archive is checked and read through one descriptor: while the neighbour swaps
    their own archive in and out under its name, no read unpacks theirs (before: checked
    by path, opened again by path; the red team saw 35 of 400)."""
    run = run_folder(project)
    caches = project / "victim" / "caches"
    proc, name, _ = victim_cache(run, caches, "save")
    out, err = proc.communicate("go\n", timeout=120)
    assert proc.returncode == 0 and (run / name).is_file(), err
    (run / name).chmod(0o644)
    reader, _, _ = victim_cache(run, caches, "400")
    swapper = as_neighbour(SWAP, str(run), name, "60")
    try:
        out, err = reader.communicate("go\n", timeout=120)
    finally:
        swapper.kill()
        swapper.wait()
    assert reader.returncode == 0, err
    assert out.split()[-2:] == ["evil", "0"], out
