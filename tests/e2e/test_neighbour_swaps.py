"""A neighbour in the project group (tests/e2e/test_neighbour.py: who they are and how the
victim runs) who renames what train made and puts their own at its name: a save's
private folder swapped for a link to a folder of the victim's (or for a folder of theirs
with a file in it) while it is written, the W&B folder swapped after its check, a link
planted at RUN/diagnostics between two jobs, the run's local-tier id rewritten, a staging
planted in a node's shared /tmp, and --stage-to in a node folder others may write. Each
must write nothing of the victim's outside the run, never adopt what the neighbour put
there, and end in status 0 or one line."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from tests.helpers.neighbour import (GROUP, PLANT_LINKS, PRECIOUS, TRAIN, as_neighbour, finish,
                                     neighbour, precious, project_folders, run_folder,
                                     victim_train)
from tests.helpers import CHECKPOINT_ARGS, REPO, TINY, write_image_folder
from tests.helpers.ranks import finish_ranks, rank_envs

pytestmark = [pytest.mark.root, pytest.mark.slow]


@pytest.fixture
def project():
    yield from project_folders()


def victims_folder(top: Path) -> Path:
    """A folder of the victim's own (0700) holding a precious model.safetensors."""
    folder = top / "victim" / "precious-folder"
    folder.mkdir(mode=0o700)
    (folder / "model.safetensors").write_bytes(PRECIOUS)
    return folder


def untouched(folder: Path) -> bool:
    return ([p.name for p in folder.iterdir()] == ["model.safetensors"]
            and (folder / "model.safetensors").read_bytes() == PRECIOUS)


# The neighbour's part: every save's folder in `folder` that appears is renamed away (to
# a name of its own in the same folder) and a link to `target` (or, with "folder", a
# folder of theirs holding a model.safetensors) put at its name, until `stop` exists.
SWAP_SAVES = """
import os, sys, time
folder, target, stop = sys.argv[1:4]
NAMES = ("model.safetensors", "optimizer.json", "optimizer.safetensors", "trainer.json",
         "rng.json", "rng.safetensors", "config.json", "MANIFEST.json")
os.umask(0o002)
swapped, theirs, end = 0, set(), time.monotonic() + 600
while not os.path.exists(stop) and time.monotonic() < end:
    for name in os.listdir(folder) if os.path.isdir(folder) else []:
        if name.startswith(".tmp-step-") and "swapped" not in name and name not in theirs:
            path = os.path.join(folder, name)
            time.sleep(0.002)  # while its files are written
            try:
                os.rename(path, path + ".swapped")
                theirs.add(name)
                if target == "folder":
                    os.mkdir(path, 0o2775)
                    for file in NAMES:
                        open(os.path.join(path, file), "x").close()
                else:
                    os.symlink(target, path)
                swapped += 1
            except OSError:
                pass
print(swapped)
"""


@pytest.mark.parametrize("how", ["in-process", "writer-process", "local-tier-copy",
                                 "neighbours-file"])
def test_a_save_folder_swapped_while_written_writes_nothing_of_the_victims(project, how):
    """S3 and T1: the save's `.tmp-step-N` is renamed away and a link to a folder of the
    victim's put at its name (before: the in-process save, the writer process's
    safetensors and the local tier's shutil.copyfile wrote through it, replacing its
    model.safetensors), or a folder of the neighbour's holding files of a checkpoint's
    names (before: a FileExistsError traceback). The save goes on in its own folder,
    reached through its descriptor, and is renamed into place by its own inode."""
    run = run_folder(project)
    (run / "checkpoints").mkdir()
    (run / "checkpoints").chmod(0o2775)  # as the victim's umask 002 makes it
    target = victims_folder(project)
    args = [*CHECKPOINT_ARGS, "--max-steps", "8", "--checkpoint-every", "1",
            "--output-dir", str(run)]
    if how in ("in-process", "neighbours-file"):
        args.append("--no-checkpoint-async")
    if how == "local-tier-copy":
        node = project / "victim" / "node"
        node.mkdir(mode=0o700)
        args += ["--checkpoint-local", str(node)]
    proc = victim_train(*args)
    swapper = as_neighbour(SWAP_SAVES, str(run / "checkpoints"),
                           "folder" if how == "neighbours-file" else str(target),
                           str(project / "stop"))
    time.sleep(0.5)  # the neighbour watches before the victim starts
    code, out = finish(proc)
    (project / "stop").touch()
    swapped, err = swapper.communicate(timeout=60)
    assert int(swapped) > 0, err  # the neighbour did swap (else the test proves nothing)
    assert untouched(target), out[-3000:]
    assert "Traceback" not in out, out[-3000:]
    if code == 2:  # swapped in the moment between the folder's mkdir and its open: refused
        [line] = [line for line in out.splitlines() if line.startswith("train: error:")]
        put = "belongs to uid" if how == "neighbours-file" else "is a symbolic link"
        assert put in line and line.endswith("someone else put it there"), line
    else:
        assert code == 0, out[-3000:]
        assert (run / "checkpoints" / "latest").read_text() == "step-000000008\n"


# The neighbour's part: once `folder` appears, it is renamed away and a link to a folder
# of the neighbour's own (which anyone may write) put at its name.
SWAP_ONCE = """
import os, sys, time
folder, theirs = sys.argv[1:3]
os.mkdir(theirs)
os.chmod(theirs, 0o777)
end = time.monotonic() + 300
while not os.path.isdir(folder) and time.monotonic() < end:
    time.sleep(0.001)
time.sleep(0.2)  # wandb.init takes seconds after the check
os.rename(folder, folder + ".swapped")
os.symlink(theirs, folder)
print("swapped")
"""


def test_the_wandb_folder_swapped_after_its_check_keeps_the_run_in_the_victims(project,
                                                                              monkeypatch):
    """S6: W&B's folder is checked, then wandb.init takes seconds to start; the neighbour
    swaps the folder for a link to theirs meanwhile (before: the whole offline run landed
    in the neighbour's folder)."""
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_MODE", raising=False)
    run = run_folder(project)
    theirs = project / "project" / "theirs"
    proc = victim_train(*CHECKPOINT_ARGS, "--max-steps", "2", "--wandb",
                        "--output-dir", str(run))
    swapper = as_neighbour(SWAP_ONCE, str(run / "wandb"), str(theirs))
    code, out = finish(proc)
    said, err = swapper.communicate(timeout=60)
    assert said.strip() == "swapped", err
    assert code == 0, out[-3000:]
    assert list(theirs.iterdir()) == [], out[-3000:]
    assert list((run / "wandb.swapped" / "wandb").glob("offline-run-*")), out[-3000:]


def test_a_link_planted_at_the_diagnostics_folder_between_two_jobs_is_not_followed(project):
    """S7: the neighbour renames RUN/diagnostics away between two jobs and puts a link to
    a folder of the victim's in its place (before: the next job wrote its heartbeats,
    start-up marks and stack file into it). The job trains on without diagnostics."""
    run = run_folder(project)
    code, out = finish(victim_train(*CHECKPOINT_ARGS, "--max-steps", "2",
                                    "--output-dir", str(run)))
    assert code == 0 and (run / "diagnostics").is_dir(), out[-3000:]
    target = victims_folder(project)
    neighbour("import os, sys; os.rename(sys.argv[1], sys.argv[1] + '.old')",
              str(run / "diagnostics"))
    neighbour(PLANT_LINKS, f"{run / 'diagnostics'}={target}")
    code, out = finish(victim_train(*CHECKPOINT_ARGS, "--max-steps", "4",
                                    "--output-dir", str(run)))
    assert untouched(target), out[-3000:]
    assert code == 0 and "Traceback" not in out, out[-3000:]
    assert f"{run / 'diagnostics'} is a symbolic link" in out, out[-3000:]


# The neighbour's part: the run folder's local-tier id replaced by one of theirs.
REWRITE_ID = """
import os, sys
os.umask(0o002)
path = sys.argv[1]
with open(path + ".theirs", "w") as f:
    f.write("0" * 32 + "\\n")
os.replace(path + ".theirs", path)
"""


def test_a_rewritten_local_tier_id_never_deletes_the_tiers_newer_checkpoint(project):
    """S8: the tier holds step 4, the run folder step 2 (the job ended before its copy);
    the neighbour rewrites RUN/checkpoints/.local-tier-id (before: the next job took the
    tier for another run's and deleted its step 4). The tier's step is resumed."""
    run = run_folder(project)
    node = project / "victim" / "node"
    node.mkdir(mode=0o700)
    args = [*CHECKPOINT_ARGS, "--checkpoint-every", "2", "--checkpoint-local", str(node),
            "--output-dir", str(run)]
    code, out = finish(victim_train(*args, "--max-steps", "4"))
    assert code == 0, out[-3000:]
    checkpoints = run / "checkpoints"
    for name in ("step-000000004",):  # as if the job ended before its copy did
        os.rename(checkpoints / name, project / "victim" / name)
    (checkpoints / "latest").write_text("step-000000002\n")
    neighbour(REWRITE_ID, str(checkpoints / ".local-tier-id"))
    code, out = finish(victim_train(*args, "--max-steps", "6"))
    assert code == 0, out[-3000:]
    assert "is newer than the run folder's newest checkpoint" in out, out[-3000:]
    assert ".local-tier-id belongs to uid" in out, out[-3000:]


# The neighbour's part: a staging of the victim's source planted in the node's shared
# folder, named and described as train names and describes one (from stat alone), holding
# the neighbour's own images under the victim's file names.
PLANT_STAGING = """
import hashlib, json, os, shutil, sys
stage, source, images = sys.argv[1:4]
os.umask(0o022)
stats = {}
for parent, _, names in os.walk(source, followlinks=True):
    for name in names:
        stats[os.path.relpath(os.path.join(parent, name), source)] = os.stat(
            os.path.join(parent, name))
digest = hashlib.sha256(source.encode())
for name in sorted(stats):
    info = stats[name]
    digest.update(f"\\0{name}\\0{info.st_size} {info.st_mtime_ns} {info.st_ctime_ns}".encode())
key = digest.hexdigest()
target = os.path.join(stage, f"{os.path.basename(source)}-{key[:16]}")
shutil.copytree(images, target)
files = {}
for parent, _, names in os.walk(target):
    for name in names:
        files[os.path.relpath(os.path.join(parent, name), target)] = os.path.getsize(
            os.path.join(parent, name))
with open(target + ".manifest.json", "w") as f:
    json.dump(dict(source=source, staging=os.path.basename(target), identity=key,
                   files=files), f)
print(target)
"""


def test_a_staging_planted_in_a_shared_tmp_is_never_adopted(project):
    """S1: --stage-to a node's /tmp (1777): the neighbour plants the staging of the
    victim's source, its name and manifest made from stat alone, holding their own images
    (before: the job trained on them, status 0)."""
    source = write_image_folder(project / "project" / "pets", classes=2, per_class=4,
                                size=8)
    for path in [source, *source.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    images = write_image_folder(project / "theirs" / "pets", classes=2, per_class=4, size=8)
    for path in [images.parent, images, *images.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    tmp = project / "node-tmp"
    tmp.mkdir()
    tmp.chmod(0o1777)
    planted = Path(neighbour(PLANT_STAGING, str(tmp), str(source), str(images)).stdout.strip())
    code, out = finish(victim_train(*TINY, "--dataset", "imagefolder", "--data-dir",
                                    str(source), "--stage-to", str(tmp), "--image-size", "8",
                                    "--batch-size", "4", "--max-steps", "1", "--output-dir",
                                    str(project / "victim" / "run")))
    assert code == 0, out[-3000:]
    assert f"reusing the staging of {source} in {planted}" not in out, out[-3000:]
    own = tmp / f"hpc-train-stage-{os.getuid()}"
    assert f"staged {source} to {own}/" in out, out[-3000:]
    assert (own.stat().st_mode & 0o777, own.stat().st_uid) == (0o700, os.getuid())


def test_stage_to_a_node_folder_others_may_write_is_refused_in_one_line(project):
    """S2: --stage-to a node folder of mode 2775: the neighbour could rename the private
    partial copy away and put a link at its name (before: it was staged there, and the
    copy's open(target, "wb") wrote through such a link)."""
    source = write_image_folder(project / "victim" / "pets", classes=2, per_class=4, size=8)
    node = project / "node"
    node.mkdir()
    os.chown(node, 0, GROUP)
    node.chmod(0o2775)
    code, out = finish(victim_train(*TINY, "--dataset", "imagefolder", "--data-dir",
                                    str(source), "--stage-to", str(node), "--image-size", "8",
                                    "--batch-size", "4", "--max-steps", "1", "--output-dir",
                                    str(project / "victim" / "run")))
    assert code == 2 and "Traceback" not in out, out[-3000:]
    [line] = [line for line in out.splitlines() if line.startswith("train: error:")]
    assert f"{node} may be written by others" in line and "sticky" in line, line
    assert list(node.iterdir()) == []


# The neighbour's part: once `file` appears in the run folder, the folder is renamed away
# and a link to `target` (a folder of the victim's) put at its name.
SWAP_RUN = """
import os, sys, time
run, file, target = sys.argv[1:4]
end = time.monotonic() + 300
while not os.path.exists(os.path.join(run, file)) and time.monotonic() < end:
    time.sleep(0.001)
os.rename(run, run + ".swapped")
os.symlink(target, run)
print("swapped")
"""


def test_the_run_folder_swapped_for_a_link_mid_run_writes_nothing_through_it(project):
    """Issue 59 §2: the neighbour renames the whole run folder away once its config.json
    is written (before the stall watchdog, the compile cache and the first step) and puts
    a link to a folder of the victim's at its name (before: diagnostics/, metrics.jsonl,
    steps.jsonl, the checkpoints and `latest`, summary.json, model.json and
    model.safetensors, replacing the victim's own, were written through it). The run goes
    on in the folder it started in, reached through its descriptor (TensorBoard's
    folder, made after the swap, too)."""
    run = run_folder(project)
    target = victims_folder(project)
    proc = victim_train(*CHECKPOINT_ARGS, "--log-every", "1", "--tensorboard",
                        "--output-dir", str(run))
    swapper = as_neighbour(SWAP_RUN, str(run), "config.json", str(target))
    code, out = finish(proc)
    said, err = swapper.communicate(timeout=60)
    assert said.strip() == "swapped", err
    assert untouched(target), out[-3000:]
    assert code == 0 and "Traceback" not in out, out[-3000:]
    moved = project / "project" / "run.swapped"
    assert [r["epoch"] for r in map(json.loads, (moved / "metrics.jsonl").read_text()
                                     .splitlines())] == [1, 2]
    assert (moved / "checkpoints" / "latest").read_text() == "step-000000016\n"
    for name in ("summary.json", "model.json", "model.safetensors", "steps.jsonl"):
        assert (moved / name).is_file(), name
    assert list((moved / "tensorboard").glob("events.out.tfevents.*"))
    assert list((moved / "diagnostics").glob("heartbeat-*.json"))
    assert f"summary in {run}/summary.json" in out, out[-3000:]


# A moment of the victim's, held still (Python runs this file, sitecustomize found on
# PYTHONPATH, in every process of the victim's): at the first audit event HOOK_EVENT whose
# path ends with HOOK_SUFFIX in a `train` process, it makes HOOK_PAUSED and waits for
# HOOK_GO (the neighbour's swap happens meanwhile), or, with HOOK_DUMP, writes what
# torch's flight recorder writes on a collective timeout, as it writes it
# (c10d::DebugInfoWriter::write: std::ofstream of the prefix + the rank, which follows a
# link and truncates; a CPU run cannot time out an NCCL collective to have torch do it).
PAUSE_AT = """import os, sys, time
done = []


def hook(event, args):
    if done or event != os.environ["HOOK_EVENT"] or not args:
        return
    if not str(args[0]).endswith(os.environ["HOOK_SUFFIX"]):
        return
    if not sys.argv or not sys.argv[0].endswith("train"):
        return
    done.append(1)
    if os.environ.get("HOOK_DUMP"):
        prefix = os.environ["TORCH_FR_DUMP_TEMP_FILE"]
        with open(prefix + os.environ.get("RANK", "0"), "wb") as dump:
            dump.write(b"the flight recorder's dump\\n")
        return
    open(os.environ["HOOK_PAUSED"], "w").close()
    end = time.monotonic() + 120
    while not os.path.exists(os.environ["HOOK_GO"]) and time.monotonic() < end:
        time.sleep(0.01)


sys.addaudithook(hook)
"""


def paused_at(top: Path, event: str, suffix: str) -> dict[str, str]:
    """The variables that hold the victim still at `event` on a path ending in `suffix`
    (PAUSE_AT), until `swap_while_paused`."""
    site = top / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(PAUSE_AT)
    return {"PYTHONPATH": str(site), "HOOK_EVENT": event, "HOOK_SUFFIX": suffix,
            "HOOK_PAUSED": str(top / "paused"), "HOOK_GO": str(top / "go")}


def swap_while_paused(top: Path, script: str, *args: str, timeout: float = 300) -> None:
    """Once the victim is held (paused_at), the neighbour runs `script`; then it goes on."""
    end = time.monotonic() + timeout
    while not (top / "paused").exists():
        assert time.monotonic() < end, "the victim never reached the moment"
        time.sleep(0.01)
    neighbour(script, *args)
    (top / "go").touch()


# The neighbour's part: `folder` renamed away, a link to `target` put at its name.
RENAME_AND_LINK = """
import os, sys
folder, target = sys.argv[1:3]
os.rename(folder, folder + ".swapped")
os.symlink(target, folder)
"""


def test_an_fsdp_rank_writes_its_shard_into_rank_0s_folder_whatever_its_name(project):
    """Issue 59 §2: under FSDP every rank writes its shard into the save's `.tmp-step-N`,
    which rank 0 made and holds. The neighbour renames it away just before rank 1 writes
    and puts a link to a folder of the victim's at its name (before: rank 1 opened it by
    that name and wrote its shard into the victim's folder). Rank 1 holds the folder rank 0
    made, found by its inode, so the save commits as if nothing happened."""
    run = run_folder(project)
    target = victims_folder(project)
    (target / "shards").mkdir()
    step = run / "checkpoints" / ".tmp-step-000000002"
    env = paused_at(project, "open", "/shards/rank-00001.safetensors")
    args = [*TINY, "--dataset", "synthetic", "--synthetic-size", "128", "--image-size", "16",
            "--num-classes", "4", "--batch-size", "16", "--seed", "9", "--precision", "fp32",
            "--strategy", "fsdp", "--max-steps", "2", "--checkpoint-every", "2",
            "--dist-start-timeout", "120", "--dist-timeout", "120", "--output-dir", str(run)]
    ranks = [subprocess.Popen([TRAIN, *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, umask=0o002, cwd=REPO, env={**rank_env, **env})
             for rank_env in rank_envs(2)]
    swap_while_paused(project, RENAME_AND_LINK, str(step), str(target))
    logs = finish_ranks(ranks)
    assert [rank.returncode for rank in ranks] == [0, 0], "\n".join(logs)[-4000:]
    assert "Traceback" not in "".join(logs), "\n".join(logs)[-4000:]
    assert sorted(p.relative_to(target).as_posix() for p in target.rglob("*")) == [
        "model.safetensors", "shards"], "\n".join(logs)[-4000:]
    assert (target / "model.safetensors").read_bytes() == PRECIOUS
    committed = run / "checkpoints" / "step-000000002"
    assert (run / "checkpoints" / "latest").read_text() == "step-000000002\n"
    assert sorted(p.name for p in (committed / "shards").iterdir()) == [
        "rank-00000.json", "rank-00000.safetensors", "rank-00001.json",
        "rank-00001.safetensors"]


def test_the_local_tier_ids_are_written_through_the_held_run_folder(project):
    """Issue 59 §3 (S8's files): the run folder's `checkpoints/.local-tier-id` is made at
    the job's start. The neighbour renames the run folder away just as train makes its
    `checkpoints/` for it and puts a link to a folder of the victim's at its name (before:
    `checkpoints/` and the id were made by the run folder's name, in the victim's folder).
    Both ids are written through descriptors: the run goes on in its own folder."""
    run = run_folder(project)
    target = victims_folder(project)
    node = project / "victim" / "node"
    node.mkdir(mode=0o700)
    proc = victim_train(*CHECKPOINT_ARGS, "--max-steps", "2", "--checkpoint-local", str(node),
                        "--output-dir", str(run),
                        env=paused_at(project, "os.mkdir", "/checkpoints"))
    proc.stdin.write("go\n")
    proc.stdin.flush()
    swap_while_paused(project, RENAME_AND_LINK, str(run), str(target))
    code, out = finish(proc)
    assert untouched(target), out[-3000:]
    assert code == 0 and "Traceback" not in out, out[-3000:]
    moved = project / "project" / "run.swapped"
    [tier] = node.glob("hpc-train-run-*")
    assert ((moved / "checkpoints" / ".local-tier-id").read_text()
            == (tier / ".local-tier-id").read_text())
    assert (moved / "checkpoints" / "latest").read_text() == "step-000000002\n"


def test_the_flight_recorder_never_writes_through_a_link_planted_in_diagnostics(project):
    """Issue 59 §2: torch's flight recorder opens `diagnostics/fr-rank-<N>` by name and
    follows a link there. A run folder's diagnostics/ that others could write (2775, as
    train made it before) gets a link at fr-rank-0 to a file of the victim's between two
    jobs (before: the next job's dump truncated that file). train closes diagnostics/ to
    others and removes what is not a file of the user's at a dump's name."""
    run = run_folder(project)
    code, out = finish(victim_train(*CHECKPOINT_ARGS, "--max-steps", "2",
                                    "--output-dir", str(run)))
    assert code == 0, out[-3000:]
    (run / "diagnostics").chmod(0o2775)  # as train made it before
    file = precious(project, "bashrc")
    neighbour(PLANT_LINKS, f"{run / 'diagnostics' / 'fr-rank-0'}={file}")
    env = {**paused_at(project, "open", "/config.json"), "HOOK_DUMP": "1"}
    code, out = finish(victim_train(*CHECKPOINT_ARGS, "--max-steps", "4",
                                    "--no-checkpoint-async", "--output-dir", str(run),
                                    env=env))
    assert code == 0 and "Traceback" not in out, out[-3000:]
    assert file.read_bytes() == PRECIOUS
    dump = run / "diagnostics" / "fr-rank-0"
    assert not dump.is_symlink() and dump.read_bytes() == b"the flight recorder's dump\n"
    assert (run / "diagnostics").stat().st_mode & 0o022 == 0
