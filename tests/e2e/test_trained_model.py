"""A finished run's model: model.json and model.safetensors, `load_trained`, `evaluate`
(which gives the run's final accuracy again) and `predict` (top classes per image file)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.helpers import TINY, clean_env, read_jsonl, run_train, write_image_folder

pytestmark = pytest.mark.slow  # every test here trains

FOLDER = [*TINY, "--dataset", "imagefolder", "--image-size", "16", "--batch-size", "4",
          "--epochs", "1", "--workers", "0"]


@pytest.fixture(scope="module")
def folder_run(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("pets")
    data = write_image_folder(root / "pets", classes=3, per_class=4)
    out = root / "run"
    run_train([*FOLDER, "--data-dir", str(data)], out)
    return out


def cli(main, argv: list[str], capsys) -> tuple[int, str, str]:
    """Run a command's main in this process: (exit status, stdout, stderr)."""
    try:
        main(argv)
        status = 0
    except SystemExit as stop:
        status = stop.code if isinstance(stop.code, int) else 1
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def evaluate(argv, capsys):
    from workload.evaluate import main
    return cli(main, [str(a) for a in argv], capsys)


def predict(argv, capsys):
    from workload.predict import main
    return cli(main, [str(a) for a in argv], capsys)


def test_model_json_describes_the_run_and_loads_in_plain_pytorch(digits_run):
    from workload.models import load_trained
    from workload.records import model_sha256

    card = json.loads((digits_run / "model.json").read_text())
    assert card["model"] == "wrn" and card["num_classes"] == 10 and card["classes"] is None
    assert card["arguments"] == dict(width=8, blocks_per_stage=1, dropout=0.01, stem="small",
                                     image_size=16)
    assert card["input"]["image_size"] == 16 and card["input"]["resize"] == "stretch"
    assert len(card["input"]["mean"]) == len(card["input"]["std"]) == 3
    assert card["weights"] == "model.safetensors" and card["dataset"] == "digits"
    model = load_trained(str(digits_run))
    assert not model.training
    summary = json.loads((digits_run / "summary.json").read_text())
    assert model_sha256(model) == summary["model_sha256"]


def test_evaluate_reproduces_the_runs_final_accuracy(digits_run, tmp_path, capsys):
    status, out, err = evaluate([digits_run, "--json", tmp_path / "e.json"], capsys)
    assert status == 0, err
    result = json.loads((tmp_path / "e.json").read_text())
    summary = json.loads((digits_run / "summary.json").read_text())
    last = read_jsonl(digits_run / "metrics.jsonl")[-1]
    assert result["accuracy"] == summary["final_accuracy"]
    assert result["loss"] == last["test_loss"]
    assert result["images"] == 359 and result["dataset"] == "digits"  # a fifth of 1,797
    assert f"accuracy {result['accuracy']:.4f}" in out


def test_evaluate_takes_other_settings_over_the_runs(digits_run, tmp_path, capsys):
    status, _, err = evaluate([digits_run / "model.json", "--batch-size", "100",
                               "--json", tmp_path / "e.json"], capsys)
    assert status == 0, err
    result = json.loads((tmp_path / "e.json").read_text())
    summary = json.loads((digits_run / "summary.json").read_text())
    assert result["batch_size"] == 100 and result["images"] == 359
    assert result["accuracy"] == pytest.approx(summary["final_accuracy"], abs=2 / 359)
    status, _, err = evaluate([digits_run, "--dataset", "synthetic", "--num-classes", "4"],
                              capsys)
    assert status == 2 and "10 classes but the data 4" in err


def normalised(images: torch.Tensor, card: dict) -> torch.Tensor:
    mean, std = (torch.tensor(card["input"][k]).view(1, 3, 1, 1) for k in ("mean", "std"))
    return (images.float() / 255 - mean) / std


def test_predict_gives_the_class_the_model_gives(digits_run, tmp_path, capsys):
    from PIL import Image

    from workload.data.datasets import load_digits
    from workload.models import load_trained, model_input

    images = load_digits(16).test.images[:12]
    folder = tmp_path / "pngs"
    folder.mkdir()
    for i, image in enumerate(images):
        Image.fromarray(image.permute(1, 2, 0).numpy()).save(folder / f"{i:02d}.png")
    card = json.loads((digits_run / "model.json").read_text())
    assert torch.equal(model_input(str(digits_run))(images), normalised(images, card))
    with torch.no_grad():
        expected = load_trained(str(digits_run))(normalised(images, card)).softmax(1)
    status, out, err = predict([digits_run, folder, "--batch-size", "5", "--top-k", "3"],
                               capsys)
    assert status == 0, err
    lines = [json.loads(line) for line in out.splitlines()]
    assert [Path(line["file"]).name for line in lines] == [f"{i:02d}.png" for i in range(12)]
    for line, probabilities in zip(lines, expected):
        assert len(line["top"]) == 3
        assert line["top"][0]["class"] == int(probabilities.argmax())
        assert line["top"][0]["probability"] == pytest.approx(float(probabilities.max()),
                                                               abs=1e-5)


def test_an_image_folder_model_names_its_classes(folder_run, tmp_path, capsys):
    card = json.loads((folder_run / "model.json").read_text())
    assert card["classes"] == ["cat", "class2", "dog"] and card["num_classes"] == 3
    assert card["input"]["resize"] == "resize-crop"
    assert card["input"]["mean"] == pytest.approx([0.485, 0.456, 0.406])
    status, _, err = evaluate([folder_run, "--json", tmp_path / "e.json"], capsys)
    assert status == 0, err
    summary = json.loads((folder_run / "summary.json").read_text())
    assert json.loads((tmp_path / "e.json").read_text())["accuracy"] == \
        summary["final_accuracy"]
    config = json.loads((folder_run / "config.json").read_text())
    photo = Path(config["data_dir"]) / "val" / "dog" / "0.jpg"
    status, out, err = predict([folder_run, photo, "--top-k", "5"], capsys)
    assert status == 0, err
    top = json.loads(out)["top"]
    assert len(top) == 3 and {t["class"] for t in top} == {"cat", "dog", "class2"}


def damage(run: Path, how: str) -> None:
    if how == "no model.json":
        (run / "model.json").unlink()
    elif how == "no weights":
        (run / "model.safetensors").unlink()
    elif how == "model.json not JSON":
        (run / "model.json").write_text('{"format": "hpc-train-model", ')
    elif how == "model.json of another kind":
        (run / "model.json").write_text('{"model": "wrn"}')
    elif how == "weights truncated":
        data = (run / "model.safetensors").read_bytes()
        (run / "model.safetensors").write_bytes(data[:len(data) // 2])
    elif how == "model.json with a NaN mean":
        text = (run / "model.json").read_text()
        (run / "model.json").write_text(text.replace('"mean": [', '"mean": [NaN, ', 1))
    elif how == "weights of another architecture":
        card = json.loads((run / "model.json").read_text())
        card["arguments"]["width"] = 16
        (run / "model.json").write_text(json.dumps(card))


@pytest.mark.parametrize("how", ["no model.json", "no weights", "model.json not JSON",
                                 "model.json of another kind", "model.json with a NaN mean",
                                 "weights truncated",
                                 "weights of another architecture"])
def test_a_missing_or_damaged_model_is_refused_in_one_line(how, digits_run, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(digits_run, run, ignore=shutil.ignore_patterns("checkpoints"))
    damage(run, how)
    image = tmp_path / "x.png"
    from PIL import Image
    Image.new("RGB", (16, 16)).save(image)
    for status, out, err in (evaluate([run, "--json", tmp_path / "e.json"], capsys),
                             predict([run, image], capsys)):
        assert status == 2 and out == ""
        assert len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "e.json").exists()


def test_evaluate_under_torchrun_gives_the_same_accuracy(digits_run, tmp_path):
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc-per-node=2", "-m", "workload.evaluate", str(digits_run),
                           "--json", str(tmp_path / "e.json")],
                          capture_output=True, text=True, timeout=300, env=clean_env())
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads((tmp_path / "e.json").read_text())
    summary = json.loads((digits_run / "summary.json").read_text())
    assert result["world_size"] == 2 and result["images"] == 359
    assert result["accuracy"] == summary["final_accuracy"]
    assert result["loss"] == pytest.approx(read_jsonl(digits_run / "metrics.jsonl")[-1]
                                           ["test_loss"], rel=1e-6)
    assert done.stdout.count("evaluate: accuracy") == 1  # rank 0 only


def edit_card(run: Path, change) -> None:
    card = json.loads((run / "model.json").read_text())
    change(card)
    (run / "model.json").write_text(json.dumps(card, allow_nan=True))


def deep(depth: int):
    value = 0
    for _ in range(depth):
        value = [value]
    return value


# model.json values that used to crash, allocate gigabytes or print nonsense (null
# probabilities, classes in arbitrary order), and the field the refusal names.
ABSURD_CARDS = {
    "mean NaN": (lambda c: c["input"].update(mean=[float("nan"), 0.5, 0.5]), "NaN"),
    "std 1e-300": (lambda c: c["input"].update(std=[1e-300, 0.2, 0.2]), "input.std"),
    "mean 1e400": (lambda c: c["input"].update(mean=[float("inf"), 0.5, 0.5]), "Infinity"),
    "dropout NaN": (lambda c: c["arguments"].update(dropout=float("nan")), "NaN"),
    "dropout 7": (lambda c: c["arguments"].update(dropout=7), "dropout"),
    "image size 40000": (lambda c: c["arguments"].update(image_size=40000), "image_size"),
    "input size 40000": (lambda c: c["input"].update(image_size=40000), "image_size"),
    "blocks 10^5": (lambda c: c["arguments"].update(blocks_per_stage=10**5),
                    "blocks_per_stage"),
    "width 10^6": (lambda c: c["arguments"].update(width=10**6), "width"),
    "width true": (lambda c: c["arguments"].update(width=True), "width"),
    "classes 10^9": (lambda c: c.update(num_classes=10**9), "num_classes"),
    "stem other": (lambda c: c["arguments"].update(stem="huge"), "stem"),
    "unknown argument": (lambda c: c["arguments"].update(depth=1000), "depth"),
    "dataset other": (lambda c: c.update(dataset="imagenet21k"), "dataset"),
    "deep nesting": (lambda c: c.update(arguments=deep(50_000)), "nested"),
}


@pytest.mark.parametrize("case", sorted(ABSURD_CARDS))
def test_absurd_model_json_values_are_refused_before_torch(case, digits_run, tmp_path):
    from workload.models import read_description
    from workload.errors import UsageError

    run = tmp_path / "run"
    shutil.copytree(digits_run, run, ignore=shutil.ignore_patterns("checkpoints"))
    change, named = ABSURD_CARDS[case]
    if case == "deep nesting":  # json.dumps itself recurses: write the text
        card = (run / "model.json").read_text()
        (run / "model.json").write_text(card.replace('"arguments": {', '"arguments": '
                                                     + "[" * 50_000 + "0" + "]" * 50_000
                                                     + ', "x": {', 1))
    else:
        edit_card(run, change)
    with pytest.raises(UsageError, match=named) as refused:
        read_description(run / "model.json")
    assert "\n" not in str(refused.value)


def test_predict_refuses_what_is_not_a_regular_file(digits_run, tmp_path, capsys):
    import os

    fifo = tmp_path / "pipe.png"
    os.mkfifo(fifo)
    for target, kind in ((fifo, "a FIFO"), (Path("/dev/zero"), "a character device")):
        status, out, err = predict([digits_run, target], capsys)
        assert status == 2 and out == "", err
        assert f"{target} is {kind}, not a regular file" in err and "does not exist" not in err


def test_the_model_file_honours_the_umask_like_the_other_files(digits_run):
    modes = {name: (digits_run / name).stat().st_mode & 0o777
             for name in ("model.safetensors", "model.json", "config.json")}
    assert len(set(modes.values())) == 1, modes  # 0600 for the weights alone before


def test_evaluate_json_naming_a_folder_is_refused_before_the_work(digits_run, tmp_path, capsys):
    (tmp_path / "e.json").mkdir()
    status, out, err = evaluate([digits_run, "--json", tmp_path / "e.json"], capsys)
    assert status == 2 and out == "" and f"--json {tmp_path / 'e.json'}" in err, err
    assert err.count("\n") == 1


def test_predict_gives_an_image_that_decodes_too_large_its_own_error_line(digits_run, tmp_path):
    """A 64 Mpixel PNG of a few hundred kB: decoded, it ended the whole command under a
    memory limit (MemoryError); it is refused from its header, the other images answered."""
    from PIL import Image

    Image.new("1", (8000, 8000)).save(tmp_path / "bomb.png")
    Image.new("RGB", (16, 16), "white").save(tmp_path / "small.png")
    done = subprocess.run([sys.executable, "-m", "workload.predict", str(digits_run),
                           str(tmp_path / "bomb.png"), str(tmp_path / "small.png")],
                          capture_output=True, text=True, timeout=300, env=clean_env())
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    bomb, small = (json.loads(line) for line in done.stdout.splitlines())
    assert "8000 x 8000 pixels" in bomb["error"] and "top" not in bomb, bomb
    assert small["top"] and "error" not in small


def test_a_batch_the_memory_cannot_hold_is_one_line_naming_the_fix(digits_run, tmp_path):
    """T3 (issue 59): model.json's image_size 2048 is within train's bounds, and predict's
    batch of 64 such images asked the CPU for gigabytes: an allocation traceback. Under a
    memory limit (a job's, here 6 GiB of address space) it is one line with the fix."""
    import resource

    from PIL import Image

    run, images = tmp_path / "run", tmp_path / "images"
    shutil.copytree(digits_run, run, ignore=shutil.ignore_patterns("checkpoints"))
    edit_card(run, lambda c: (c["arguments"].update(image_size=2048),
                              c["input"].update(image_size=2048)))
    images.mkdir()
    for number in range(64):
        Image.new("RGB", (16, 16), "white").save(images / f"{number}.png")
    limit = 6 << 30
    done = subprocess.run([str(Path(sys.executable).with_name("predict")), str(run),
                           str(images)], capture_output=True, text=True, timeout=300,
                          env=clean_env(), preexec_fn=lambda: resource.setrlimit(
                              resource.RLIMIT_AS, (limit, limit)))
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert done.stderr.startswith("predict: error: a batch of 64 images of 2048x2048 pixels "
                                  "does not fit in the memory of cpu"), done.stderr
    assert done.stderr.strip().endswith("pass a smaller --batch-size, e.g. --batch-size 4")
    assert done.stderr.count("\n") == 1
