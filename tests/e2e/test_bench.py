"""`bench input` and `bench train` run on the CPU and write the documented JSON.

Speed is never asserted here: only that each figure is there, positive, and labelled.
"""

import json
import os
import re
import subprocess
import sys

import pytest

from tests.helpers import REPO, tmpfs
from workload.bench.cli import main as bench_main

TINY_DATA = ["--dataset", "synthetic", "--synthetic-size", "256", "--num-classes", "4",
             "--device", "cpu"]
TINY_MODEL = ["--model", "wrn", "--width", "8", "--blocks-per-stage", "1"]
FINGERPRINT_KEYS = {"date", "host", "slurm_job_id", "devices", "driver", "cuda", "cudnn",
                    "nccl", "versions", "switches", "threads"}


def check_report(report: dict, command: str, names: set[str]) -> dict:
    assert report["command"] == command
    assert FINGERPRINT_KEYS <= report["fingerprint"].keys()
    assert {"torch", "dali"} <= report["fingerprint"]["versions"].keys()
    switches = report["fingerprint"]["switches"]
    assert {"tf32_matmul", "tf32_cudnn", "cudnn_benchmark"} <= switches.keys()
    assert report["fingerprint"]["threads"]["torch_threads"] >= 1
    results = report["results"]
    assert set(results) == names
    for result in results.values():
        assert result["images_per_second"] > 0
        assert len(result["runs_images_per_second"]) >= 1
    return results


def test_bench_input_measures_every_backend_against_the_reference(tmp_path):
    # The installed console script, in its own process, as a user runs it.
    out = tmp_path / "input.json"
    done = subprocess.run(["bench", "input", *TINY_DATA, "--batch-size", "32", "--batches",
                           "2", "--rounds", "2", "--json", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    results = check_report(json.loads(out.read_text()), "input",
                           {"device", "dali", "torch", "reference"})
    assert results["reference"]["vs_reference"] == 1
    assert all(len(r["runs_images_per_second"]) == 2 for r in results.values())
    for name in results:  # the printed table names every backend
        assert name in done.stdout


def test_bench_input_compares_dali_cpu_with_torch_on_an_image_folder(tmp_path, capsys):
    from tests.helpers import write_image_folder

    folder = write_image_folder(tmp_path / "images", classes=2, per_class=8, size=40)
    out = tmp_path / "input.json"
    bench_main(["input", "--dataset", "imagefolder", "--data-dir", str(folder), "--device",
                "cpu", "--image-size", "32", "--batch-size", "4", "--batches", "2",
                "--rounds", "1", "--workers", "1", "--json", str(out)])
    report = json.loads(out.read_text())
    results = check_report(report, "input", {"dali", "torch"})
    assert report["settings"]["baseline"] == "torch" and results["torch"]["vs_baseline"] == 1
    assert results["dali"]["vs_baseline"] > 0 and "x torch" in capsys.readouterr().out


def test_bench_input_reads_shards_with_dali_and_torch(shard_folder, tmp_path):
    out = tmp_path / "input.json"
    bench_main(["input", "--dataset", "shards", "--data-dir", str(shard_folder), "--device",
                "cpu", "--image-size", "8", "--batch-size", "8", "--batches", "2",
                "--rounds", "1", "--workers", "1", "--json", str(out)])
    results = check_report(json.loads(out.read_text()), "input", {"dali", "torch"})
    assert results["torch"]["vs_baseline"] == 1


def test_bench_input_compares_shards_with_their_image_folder_both_staged(
        shard_source, shard_folder, tmp_path, capsys):
    out, local = tmp_path / "input.json", tmp_path / "local"
    bench_main(["input", "--dataset", "shards", "--data-dir", str(shard_folder),
                "--versus-folder", str(shard_source), "--stage-to", str(local), "--device",
                "cpu", "--image-size", "8", "--batch-size", "8", "--batches", "1",
                "--rounds", "1", "--workers", "0", "--json", str(out)])
    report = json.loads(out.read_text())
    rows = {f"{staged}{data} {reader}" for staged in ("", "staged ")
            for data in ("shards", "folder") for reader in ("torch", "dali")}
    results = check_report(report, "input", rows)
    assert report["settings"]["baseline"] == "folder torch"
    assert results["folder torch"]["vs_baseline"] == 1
    # 240 images: 10 shards of 25, an index per split, and the manifest.
    assert report["settings"]["files"] == {"shards": 13, "folder": 240, "staged shards": 13,
                                           "staged folder": 240}
    assert "folder: 240 files" in capsys.readouterr().out
    assert len([p for p in local.iterdir() if p.is_dir()]) == 2


def test_bench_input_times_reading_alone_shards_against_their_folder(shard_source,
                                                                     shard_folder, tmp_path):
    out = tmp_path / "input.json"
    bench_main(["input", "--dataset", "shards", "--data-dir", str(shard_folder),
                "--versus-folder", str(shard_source), "--read-only", "--device", "cpu",
                "--batch-size", "16", "--batches", "10", "--rounds", "2", "--json", str(out)])
    report = json.loads(out.read_text())
    results = check_report(report, "input", {"shards read", "folder read"})
    assert report["settings"]["baseline"] == "folder read" and report["settings"]["read_only"]
    assert results["shards read"]["vs_baseline"] > 0  # 10 batches: more than an epoch


def test_bench_input_refuses_a_folder_that_is_not_the_shards_source(shard_folder, tmp_path,
                                                                   capsys):
    from tests.helpers import write_image_folder

    other = write_image_folder(tmp_path / "other", classes=2, per_class=3, size=8)
    with pytest.raises(SystemExit) as stop:
        bench_main(["input", "--dataset", "shards", "--data-dir", str(shard_folder),
                    "--versus-folder", str(other), "--device", "cpu", "--image-size", "8",
                    "--batch-size", "8", "--batches", "1", "--rounds", "1"])
    assert stop.value.code == 2
    assert f"--versus-folder {other} holds 12 images and the shards 240; pass the image " \
           "folder the shards were written from" in capsys.readouterr().err


def test_bench_train_sweeps_batch_sizes_with_flops(tmp_path, capsys):
    out = tmp_path / "train.json"
    bench_main(["train", *TINY_DATA, *TINY_MODEL, "--batch-sizes", "4,8", "--steps", "1",
                "--warmup", "1", "--json", str(out)])
    report = json.loads(out.read_text())
    results = check_report(report, "train", {"wrn-bs4", "wrn-bs8"})
    for name, result in results.items():
        assert result["batch_size"] == int(name.split("bs")[1]) and result["world_size"] == 1
        assert result["flops_per_image"] > 0 and result["achieved_tflops"] > 0
        assert result["images_per_second_total"] == pytest.approx(result["images_per_second"])
        assert result["peak"] is None  # no datasheet peak for a CPU
    assert "GFLOP/img" in capsys.readouterr().out


def test_bench_train_puts_the_reference_loop_beside_the_optimised_one(tmp_path):
    out = tmp_path / "versus.json"
    bench_main(["train", *TINY_DATA, *TINY_MODEL, "--versus-reference", "--batch-size", "8",
                "--steps", "1", "--warmup", "1", "--json", str(out)])
    results = check_report(json.loads(out.read_text()), "train", {"reference", "optimised"})
    reference, optimised = results["reference"], results["optimised"]
    assert (reference["precision"], reference["channels_last"]) == ("fp32", False)
    assert reference["pipeline"] == "reference per-sample"
    assert (optimised["precision"], optimised["channels_last"]) == ("bf16", True)
    assert optimised["pipeline"] == "device" and optimised["model"] == "wrn"
    assert optimised["vs_reference"] == pytest.approx(
        optimised["images_per_second"] / reference["images_per_second"])


def test_flops_per_image_of_the_reference_wide_resnet():
    # About 14.5 GFLOP per 32x32 image, forward and backward (the figure behind the
    # docs/performance.md's GPU estimates).
    from workload.bench.train import flops_per_image
    from workload.config import TrainConfig

    flops = flops_per_image(TrainConfig().replace(model="wrn"), num_classes=100, image_size=32)
    assert 14.0e9 < flops < 15.0e9


@pytest.mark.parametrize("args, named", [
    (["train", "--batch-sizes", "0,8"], "--batch-sizes"),
    (["train", "--steps", "0"], "--steps"),
    (["input", "--backends", "device,nope"], "nope"),
    (["input", "--rounds", "0"], "--rounds"),
    (["input", "--threads", "-1"], "--threads"),
    (["input", "--versus-folder", "F"], "--versus-folder F compares shards"),
    (["input", "--read-only"], "--read-only times reading image files"),
])
def test_bench_rejects_bad_input_before_measuring(args, named, capsys):
    with pytest.raises(SystemExit) as stop:
        bench_main([*args, *TINY_DATA])
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("bench: error:") and named in err and "\n" not in err


def test_the_checkpoint_save_benchmark_prints_both_times_and_their_ratio():
    """tools/bench_checkpoint_save.py (docs/performance.md) on a tiny model: it runs the
    synchronous and the asynchronous save and the bare write side by side and prints the
    ratios; no speed is asserted."""
    done = subprocess.run([sys.executable, "tools/bench_checkpoint_save.py", "--width", "8",
                           "--repeats", "1"], capture_output=True, text=True, timeout=300,
                          cwd=REPO)
    assert done.returncode == 0, done.stderr
    for what in ("save_checkpoint: blocked", "Checkpoints async: blocked",
                 "Checkpoints async: committed", "train sync: blocked", "train async: blocked",
                 "train async: committed", "write + fsync, same bytes"):
        ratio = re.search(rf"^{re.escape(what)} +[0-9.]+ s .* ([0-9.]+)x the write$",
                          done.stdout, re.M)
        assert ratio and float(ratio.group(1)) > 0, (what, done.stdout)


def test_bench_commit_times_a_checkpoint_s_commit_against_a_bare_write(tmp_path):
    """`bench commit` (issue 62) at a tiny size, the console script as a user runs it: both
    rows and their ratio printed, the JSON's figures, nothing left in --dir."""
    out = tmp_path / "commit.json"
    disk = tmp_path / "disk"
    disk.mkdir()
    done = subprocess.run(["bench", "commit", "--size-mb", "0.2", "--rounds", "2", "--dir",
                           str(disk), "--json", str(out)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert re.search(r"^commit \(files, fsyncs, renames\) .* [0-9.]+$", done.stdout, re.M)
    assert re.search(r"^write \+ fsync, same bytes .* 1$", done.stdout, re.M)
    assert re.search(r"^sha256 of the same bytes .* [0-9.]+$", done.stdout, re.M)
    ratio = re.search(r"^commit / write: ([0-9.]+)x \(medians\)", done.stdout, re.M)
    assert ratio and float(ratio.group(1)) > 0, done.stdout
    report = json.loads(out.read_text())
    assert report["command"] == "commit" and FINGERPRINT_KEYS <= report["fingerprint"].keys()
    results = report["results"]
    assert len(results["commit_s"]) == len(results["write_s"]) == len(results["hash_s"]) == 2
    assert results["ratio"] == results["commit_median_s"] / results["write_median_s"] > 0
    assert results["bytes"] >= 200_000 and results["files"] == 7
    assert list(disk.iterdir()) == []


@pytest.mark.parametrize("args, named", [
    (["--size-mb", "0"], "--size-mb must be more than 0, got 0.0"),
    (["--rounds", "0"], "--rounds must be 1 or more, got 0"),
    (["--dir", "/proc/version"], "--dir /proc/version cannot be written"),
])
def test_bench_commit_rejects_bad_input_before_measuring(args, named, capsys):
    with pytest.raises(SystemExit) as stop:
        bench_main(["commit", *args])
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("bench: error:") and named in err and "\n" not in err


@pytest.mark.root
@pytest.mark.parametrize("room, named", [
    # 1 MB of blocks for 5 MB of state: refused by its free space, before any work
    ("size=1m", "has 1.0 MB free, and bench commit --size-mb 5 holds about 15.0 MB"),
    # blocks enough, but 8 inodes (files and folders): the disk fills during the rounds
    ("size=64m,nr_inodes=8", "filled up during bench commit (No space left on device)"),
])
def test_bench_commit_on_a_disk_without_room_is_one_line_and_leaves_nothing(room, named,
                                                                            tmp_path):
    with tmpfs(tmp_path / "disk", room) as disk:
        done = subprocess.run(["bench", "commit", "--size-mb", "5", "--rounds", "1", "--dir",
                               str(disk)], capture_output=True, text=True, timeout=120)
        left = list(disk.iterdir())
    assert done.returncode == 2, done.stderr
    err = done.stderr.strip()
    assert err.startswith(f"bench: error: --dir {disk} ") and named in err, err
    assert "\n" not in err and left == []


@pytest.mark.slow
def test_bench_train_waits_for_a_missing_rank_only_as_long_as_dist_timeout(tmp_path):
    # bench starts its process as train does: --dist-timeout bounds the rendezvous, and a
    # rank that never comes is one line naming the address, not a ten-minute hang.
    import socket

    from tests.helpers import clean_env

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**clean_env(), "WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "0",
           "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    done = subprocess.run([sys.executable, "-m", "workload.bench.cli", "train", *TINY_DATA,
                           *TINY_MODEL, "--batch-sizes", "4", "--steps", "1", "--warmup", "1",
                           "--dist-timeout", "3"],
                          capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 2, done.stderr
    assert f"127.0.0.1:{port}" in done.stderr and "within 3 s" in done.stderr, done.stderr


@pytest.mark.parametrize("kind", ["folder", "fifo"])
def test_bench_json_that_cannot_be_a_file_is_refused_before_measuring(kind, tmp_path):
    """Found only after the measurement before: a traceback, or a wait for a FIFO reader."""
    target = tmp_path / "out.json"
    target.mkdir() if kind == "folder" else os.mkfifo(target)
    done = subprocess.run([sys.executable, "-m", "workload.bench.cli", "train", *TINY_DATA,
                           "--json", str(target)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stdout == "", done.stdout + done.stderr
    assert done.stderr.startswith(f"bench: error: --json {target} cannot be written")
