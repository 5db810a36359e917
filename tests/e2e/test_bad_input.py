"""Bad input: one clear line on stderr, exit status 2, nothing written, no training."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import TINY, clean_env, free_port, write_cifar100, write_image_folder
from workload.train import main as train_main


def bad_cifar_dir(tmp_path):
    folder = write_cifar100(tmp_path / "corrupt")
    (folder / "test").write_bytes(b"\x80\x02 this is not a pickle")
    return str(tmp_path / "corrupt")


def file_in_the_way(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    return str(blocker / "run")


def looped_image_folder(tmp_path):
    write_image_folder(tmp_path / "images", per_class=1)
    (tmp_path / "images" / "train" / "dog" / "loop").symlink_to(tmp_path / "images")
    return str(tmp_path / "images")


def overlapping_stage(tmp_path, where: str) -> list[str]:
    """--data-dir and a --stage-to inside it, holding it, or inside it through a link."""
    data = write_image_folder(tmp_path / "pets", per_class=1)
    stage = {"inside the data": data / "staged", "holding the data": tmp_path,
             "inside through a link": tmp_path / "link" / "staged"}[where]
    (tmp_path / "link").symlink_to(data)
    return ["--data-dir", str(data), "--stage-to", str(stage)]


def shard_manifest_saying(tmp_path, **entry) -> str:
    """A shard folder whose manifest's one shard says `entry` (a count far past any data:
    refused by the manifest's bounds, before anything is allocated or read by it)."""
    folder = tmp_path / "shards"
    folder.mkdir()
    shard = {**dict(name="train-000000.tar", samples=10, bytes=40960, sha256="0" * 64,
                    index=[0, 1000]), **entry}
    (folder / "manifest.json").write_text(json.dumps(dict(
        format="hpc-train-shards", format_version=2, classes=["a", "b"],
        splits=dict(train=dict(samples=10, shards=[shard]), val=dict(samples=0, shards=[])))))
    return str(folder)


CASES = {
    # name: (extra args, builder of args needing tmp_path, words the message must contain)
    "batch size 0": (["--batch-size", "0"], None, ["--batch-size", "1 or more", "got 0"]),
    "negative lr": (["--base-lr", "-0.1"], None, ["--base-lr", "greater than 0", "-0.1"]),
    "unknown model": (["--model", "vgg"], None, ["--model 'vgg'", "did you mean", "vgg16"]),
    "unknown dataset": (["--dataset", "mnist"], None, ["--dataset", "invalid choice", "digits"]),
    "accuracy as a percent": (["--target-accuracy", "95"], None, ["at most 1.0", "0.95 for 95 %"]),
    "missing cifar": (["--dataset", "cifar100"], lambda p: ["--data-dir", str(p / "empty")],
                      ["CIFAR-100 not found", "--download"]),
    "corrupt cifar": (["--dataset", "cifar100"], lambda p: ["--data-dir", bad_cifar_dir(p)],
                      ["not a readable CIFAR-100", "test"]),
    "imagefolder without train/": (["--dataset", "imagefolder"],
                                   lambda p: ["--data-dir", str(p)], ["train/", "--data-dir"]),
    "output dir not writable": (["--dataset", "digits"],
                                lambda p: ["--output-dir", file_in_the_way(p)],
                                ["--output-dir", "not a writable directory"]),
    "infinite lr": (["--base-lr", "inf"], None, ["--base-lr", "finite"]),
    "infinite weight decay": (["--weight-decay", "inf"], None, ["--weight-decay", "finite"]),
    "absurd lr": (["--base-lr", "1e308"], None, ["--base-lr", "at most"]),
    "infinite warm-up": (["--warmup-epochs", "inf"], None, ["--warmup-epochs", "finite"]),
    "20-digit seed": (["--seed", "12345678901234567890"], None, ["--seed", "from 0 to 4294967295"]),
    "infinite timeout": (["--dist-timeout", "inf"], None, ["--dist-timeout", "finite"]),
    "batch larger than the data": (["--dataset", "synthetic", "--synthetic-size", "64",
                                    "--batch-size", "128"], None,
                                   ["--batch-size 128", "0 steps", "--batch-size 64 or less"]),
    **{f"--stage-to {where}": (["--dataset", "imagefolder", "--image-size", "32"],
                               lambda p, where=where: overlapping_stage(p, where),
                               ["--stage-to", "overlap", "outside"])
       for where in ("inside the data", "holding the data", "inside through a link")},
    "a newline in --output-dir": (["--dataset", "digits"],
                                  lambda p: ["--output-dir", str(p / "run\nPATH=x")],
                                  ["--output-dir", "\\n", "control character"]),
    "--init-from a file that is not there": (
        ["--dataset", "digits"], lambda p: ["--init-from", str(p / "gone.safetensors")],
        ["--init-from", "gone.safetensors does not exist", "path of a .safetensors file"]),
    "image folder link loop": (["--dataset", "imagefolder", "--image-size", "32"],
                               lambda p: ["--data-dir", looped_image_folder(p)],
                               ["symbolic link loop", "remove the link"]),
    **{f"a shard manifest's {field} of {value:.0e}": (
        ["--dataset", "shards", "--image-size", "32"],
        lambda p, field=field, value=value: ["--data-dir", shard_manifest_saying(p, **{
            field: value if field != "index" else [0, value]})],
        ["manifest.json is not a shard manifest", f"{field}", "write the shards again"])
       for field, value in (("samples", 10**15), ("bytes", 2**70), ("index", 10**15))},
}


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_bad_input_exits_2_with_one_clear_line(case, tmp_path, capsys):
    args, builder, words = CASES[case]
    extra = builder(tmp_path) if builder else []
    out = tmp_path / "run"
    argv = ["--device", "cpu", "--max-steps", "1", "--output-dir", str(out), *args, *extra]
    with pytest.raises(SystemExit) as exit_info:
        train_main(argv)
    assert exit_info.value.code == 2
    captured = capsys.readouterr()
    error_lines = [line for line in captured.err.splitlines() if "error:" in line]
    assert len(error_lines) == 1, captured.err
    for word in words:
        assert word in error_lines[0]
    assert "Traceback" not in captured.err + captured.out
    assert not out.exists(), "nothing may be written on bad input"
    assert "epoch" not in captured.out


def test_cuda_requested_without_a_gpu_says_how_to_fix(capsys, tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is visible: --device cuda is valid here")
    with pytest.raises(SystemExit) as exit_info:
        train_main(["--device", "cuda", "--output-dir", str(tmp_path / "run")])
    assert exit_info.value.code == 2
    assert "--device cpu" in capsys.readouterr().err


def test_console_script_exit_status(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "workload.train", "--batch-size", "0",
         "--output-dir", str(tmp_path / "run")], capture_output=True, text=True)
    assert result.returncode == 2
    assert result.stderr.strip().startswith("train: error: --batch-size")
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_a_diverging_loss_stops_the_run_with_one_line(tmp_path, capsys):
    argv = [*TINY, "--dataset", "synthetic", "--synthetic-size", "128", "--image-size", "16",
            "--num-classes", "4", "--batch-size", "16", "--epochs", "2", "--base-lr", "1000",
            "--warmup-epochs", "0", "--output-dir", str(tmp_path / "run")]
    with pytest.raises(SystemExit) as exit_info:
        train_main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "training loss became nan" in err and "--allow-nonfinite-loss" in err
    assert not (tmp_path / "run" / "summary.json").exists()
    allowed = tmp_path / "allowed"
    train_main([*argv[:-1], str(allowed), "--allow-nonfinite-loss", "--epochs", "1"])
    summary = (allowed / "summary.json").read_text()
    assert "NaN" not in summary and "Infinity" not in summary  # strict JSON: null


def run_rank(rank: int, port: int, tmp_path, dist_timeout: str = "3",
             timeout: int = 300) -> subprocess.CompletedProcess:
    env = {**clean_env(), "WORLD_SIZE": "2", "RANK": str(rank), "LOCAL_RANK": "0",
           "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    return subprocess.run([sys.executable, "-m", "workload.train", *TINY, "--dataset",
                           "synthetic", "--synthetic-size", "64", "--max-steps", "1",
                           "--dist-start-timeout", "3", "--dist-timeout", dist_timeout,
                           "--output-dir", str(tmp_path / "run")],
                          capture_output=True, text=True, env=env, timeout=timeout)


@pytest.mark.slow
def test_a_missing_peer_is_one_line_naming_the_address(tmp_path):
    port = free_port()
    done = run_rank(1, port, tmp_path)  # rank 0 never comes
    assert done.returncode == 2, done.stderr
    errors = [line for line in done.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and "Traceback" not in done.stderr, done.stderr
    assert "frame #" not in done.stderr, done.stderr  # no C++ stack either
    assert f"127.0.0.1:{port}" in done.stderr and "all 2 ranks" in done.stderr
    assert "within 3 s" in done.stderr and "--dist-start-timeout" in done.stderr


@pytest.mark.slow
def test_a_start_timeout_below_the_dist_timeout_is_the_one_waited(tmp_path):
    """--dist-start-timeout 3 with --dist-timeout 600 waited 600 s (a max() of the two)."""
    done = run_rank(1, free_port(), tmp_path, dist_timeout="600", timeout=120)
    assert done.returncode == 2, done.stderr
    assert "within 3 s" in done.stderr and "--dist-start-timeout" in done.stderr


@pytest.mark.slow
def test_an_occupied_port_is_one_line_naming_it(tmp_path):
    import socket

    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = run_rank(0, port, tmp_path)
    assert done.returncode == 2, done.stderr
    errors = [line for line in done.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and "Traceback" not in done.stderr, done.stderr
    assert "frame #" not in done.stderr, done.stderr  # no C++ stack either
    assert f"127.0.0.1:{port}" in done.stderr and "in use" in done.stderr
    assert "MASTER_PORT" in done.stderr


@pytest.mark.root  # a mount namespace of its own
@pytest.mark.slow
def test_train_where_proc_is_not_mounted_is_one_line_naming_it(tmp_path):
    """A root without /proc (a chroot, `apptainer exec --no-mount proc`): the package
    reaches the folders it writes through /proc/PID/fd (workload/held.py), so train stops
    before any work with the line that says so, not a traceback at its first write."""
    train = [str(Path(sys.executable).parent / "train"), *TINY, "--dataset", "synthetic",
             "--synthetic-size", "64", "--batch-size", "16", "--max-steps", "1",
             "--output-dir", str(tmp_path / "run")]
    done = subprocess.run(["unshare", "--mount", "--fork", "sh", "-c",
                           'mount -t tmpfs none /proc && exec "$@"', "sh", *train],
                          capture_output=True, text=True, env=clean_env(), timeout=300)
    assert done.returncode == 2, done.stderr
    errors = [line for line in done.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and "Traceback" not in done.stderr, done.stderr
    assert "/proc is not mounted here" in errors[0] and "mount -t proc" in errors[0]
    assert not (tmp_path / "run" / "checkpoints").exists()
