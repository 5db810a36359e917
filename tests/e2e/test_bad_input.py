"""Bad input: one clear line on stderr, exit status 2, nothing written, no training."""

import subprocess
import sys

import pytest

from tests.helpers import write_cifar100
from workload.train import main as train_main


def bad_cifar_dir(tmp_path):
    folder = write_cifar100(tmp_path / "corrupt")
    (folder / "test").write_bytes(b"\x80\x02 this is not a pickle")
    return str(tmp_path / "corrupt")


def file_in_the_way(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    return str(blocker / "run")


CASES = {
    # name: (extra args, builder of args needing tmp_path, words the message must contain)
    "batch size 0": (["--batch-size", "0"], None, ["--batch-size", "positive", "got 0"]),
    "negative lr": (["--base-lr", "-0.1"], None, ["--base-lr", "greater than 0", "-0.1"]),
    "unknown model": (["--model", "vgg"], None, ["--model 'vgg'", "did you mean", "vgg16"]),
    "unknown dataset": (["--dataset", "mnist"], None, ["--dataset", "invalid choice", "digits"]),
    "accuracy as a percent": (["--target-accuracy", "95"], None, ["fraction", "0.95"]),
    "missing cifar": (["--dataset", "cifar100"], lambda p: ["--data-dir", str(p / "empty")],
                      ["CIFAR-100 not found", "--download"]),
    "corrupt cifar": (["--dataset", "cifar100"], lambda p: ["--data-dir", bad_cifar_dir(p)],
                      ["not a readable CIFAR-100", "test"]),
    "imagefolder without train/": (["--dataset", "imagefolder"],
                                   lambda p: ["--data-dir", str(p)], ["train/", "--data-dir"]),
    "output dir not writable": (["--dataset", "digits"],
                                lambda p: ["--output-dir", file_in_the_way(p)],
                                ["--output-dir", "not a writable directory"]),
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
