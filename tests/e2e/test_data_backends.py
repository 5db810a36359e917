"""`--data-backend`: the automatic choice and its printed reason, every backend training,
and bad requests refused before any work."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.helpers import TINY, clean_env, run_train, write_image_folder
from workload.data import available, build_data, choose
from workload.errors import UsageError

SYNTHETIC = ["--dataset", "synthetic", "--synthetic-size", "256", "--num-classes", "4",
             "--batch-size", "32", "--epochs", "1"]
CPU, GPU = torch.device("cpu"), torch.device("cuda", 0)


def test_dali_is_registered_when_it_imports():
    assert {"device", "torch", "dali"} <= available().keys()


def test_building_the_device_backend_does_not_import_dali():
    """Importing nvidia.dali costs about 1.5 s of CPU: a run that reads through another
    backend (every in-memory dataset, by default) must not pay it at start."""
    code = ("import sys, torch\n"
            "from workload.config import TrainConfig\n"
            "from workload.data import build_data\n"
            "cfg = TrainConfig()\n"
            "cfg.data.dataset, cfg.data.synthetic_size, cfg.data.num_classes = 'synthetic', 64, 4\n"
            "cfg.training.batch_size = 16\n"
            "bundle = build_data(cfg, torch.device('cpu'))\n"
            "print(bundle.backend, 'nvidia.dali' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, env=clean_env())
    assert done.stdout.split() == ["device", "False"], done.stdout + done.stderr[-2000:]


def test_dali_is_the_build_for_torchs_cuda_major():
    """requirements/test.txt must pair torch with the DALI wheel of the same CUDA major
    (nvidia-dali-cuda130 for torch 2.14.1+cu130); doctor warns when they differ."""
    import nvidia.dali.backend as backend
    assert torch.version.cuda, "the test environment's torch is a CUDA build"
    dali_major = backend.__cuda_version__ // 1000
    assert dali_major == int(torch.version.cuda.split(".")[0]), (
        f"DALI built for CUDA {dali_major}, torch {torch.__version__} for CUDA "
        f"{torch.version.cuda}: pip install nvidia-dali-cuda{torch.version.cuda.split('.')[0]}0")


def test_dali_cpu_pipeline_feeds_torch():
    """A CPU-only DALI pipeline (device_id=None: no GPU needed) through the PyTorch
    iterator: external source, flip, crop-mirror-normalize to float CHW."""
    import numpy as np
    from nvidia.dali import fn, pipeline_def, types
    from nvidia.dali.plugin.pytorch import DALIGenericIterator

    images = np.arange(8 * 4 * 4 * 3, dtype=np.uint8).reshape(8, 4, 4, 3)

    @pipeline_def(batch_size=4, num_threads=1, device_id=None)
    def pipeline():
        x = fn.external_source(source=[list(images[:4]), list(images[4:])], cycle=True)
        x = fn.flip(x, horizontal=1)
        return fn.crop_mirror_normalize(x, dtype=types.FLOAT, output_layout="CHW",
                                        mean=[0.0] * 3, std=[255.0] * 3)

    batches = [b[0]["x"] for b in DALIGenericIterator([pipeline()], ["x"], size=8)]
    assert [tuple(b.shape) for b in batches] == [(4, 3, 4, 4)] * 2
    assert all(b.device.type == "cpu" and b.dtype == torch.float32 for b in batches)
    expected = torch.from_numpy(images[:4, :, ::-1].copy()).permute(0, 3, 1, 2) / 255.0
    assert torch.allclose(batches[0], expected)


@pytest.mark.parametrize("dataset, device, backend, why", [
    ("cifar100", CPU, "device", "fits in memory"),
    ("digits", GPU, "device", "fits in memory"),
    ("imagefolder", CPU, "torch", "no GPU"),
    ("imagefolder", GPU, "dali", "on the GPU by NVIDIA DALI"),
])
def test_auto_choice_and_its_reason(dataset, device, backend, why):
    chosen, reason = choose("auto", dataset, device)
    assert chosen == backend and why in reason


@pytest.mark.parametrize("backend", ["device", "torch", "dali"])
@pytest.mark.slow
def test_every_backend_trains_and_says_so(backend, tmp_path, capsys):
    summary = run_train([*TINY, *SYNTHETIC, "--data-backend", backend], tmp_path / "run")
    assert summary["steps_run"] == 256 // 32 and summary["final_accuracy"] is not None
    assert f"data backend {backend}:" in capsys.readouterr().out


@pytest.mark.slow
def test_dali_trains_the_same_model_as_the_device_backend_on_the_cpu(tmp_path):
    # Same shard order, same per-batch flips and offsets: bit-identical weights.
    args = [*TINY, *SYNTHETIC, "--max-steps", "4", "--seed", "3"]
    device = run_train([*args, "--data-backend", "device"], tmp_path / "device")
    dali = run_train([*args, "--data-backend", "dali"], tmp_path / "dali")
    assert device["model_sha256"] == dali["model_sha256"]


def test_device_backend_cannot_read_image_folders():
    with pytest.raises(UsageError, match="--data-backend device needs an in-memory dataset"):
        choose("device", "imagefolder", CPU)


def test_unknown_backend_exits_2(tmp_path, capsys):
    with pytest.raises(SystemExit) as stop:
        run_train([*TINY, *SYNTHETIC, "--data-backend", "fast"], tmp_path / "run")
    assert stop.value.code == 2 and "--data-backend" in capsys.readouterr().err


@pytest.mark.parametrize("backend", ["dali", "torch"])
@pytest.mark.slow
def test_image_folders_are_decoded_by_dali_and_by_torch(backend, tmp_path, capsys):
    write_image_folder(tmp_path / "images")
    summary = run_train([*TINY, "--dataset", "imagefolder", "--data-dir", str(tmp_path / "images"),
                         "--image-size", "32", "--batch-size", "4", "--epochs", "1",
                         "--data-backend", backend], tmp_path / "run")
    assert summary["steps_run"] == 16 // 4 and summary["final_accuracy"] is not None
    assert f"data backend {backend}:" in capsys.readouterr().out


@pytest.mark.slow
def test_dali_names_a_fifo_in_the_image_folder_instead_of_waiting_on_it(tmp_path):
    """A neighbour with write access to a project's image folder puts a FIFO in place of
    an image: the DALI backend's read waited for a writer forever."""
    images = write_image_folder(tmp_path / "images")
    fifo = images / "train" / "cat" / "3.jpg"
    fifo.unlink()
    os.mkfifo(fifo)
    done = subprocess.run([str(Path(sys.executable).parent / "train"), *TINY, "--dataset",
                           "imagefolder", "--data-dir", str(images), "--image-size", "32",
                           "--batch-size", "4", "--epochs", "1", "--data-backend", "dali",
                           "--output-dir", str(tmp_path / "run")],
                          capture_output=True, text=True, env=clean_env(), timeout=180)
    said = [line for line in done.stderr.splitlines() if "error:" in line]
    assert done.returncode == 2 and len(said) == 1, done.stderr[-3000:]
    assert f"--data-backend dali cannot read an image file ({fifo} is a FIFO, not a file)" \
        in said[0] and "--data-backend torch" in said[0], said
    assert "Traceback" not in done.stderr


def test_dali_and_torch_read_shards_in_the_same_order(shard_folder):
    """DALI decodes the shards (its CPU pipeline here) in the shard order the torch
    reader follows: the same samples, and so the same classes, batch by batch."""
    from workload.config import build_config

    def classes(backend: str, epoch: int) -> tuple[list, list]:
        cfg = build_config(dict(dataset="shards", data_dir=str(shard_folder), image_size=8,
                                batch_size=16, workers=0, seed=6, data_backend=backend), "cpu")
        train = build_data(cfg, CPU).train
        return ([labels.tolist() for _, labels in train.batches(epoch)],
                [labels.tolist() for _, labels in train.batches(epoch, start=5)])

    for epoch in (0, 1):
        whole, rest = classes("dali", epoch)
        assert (whole, rest) == classes("torch", epoch) and rest == whole[5:]
        assert len(whole) == 120 // 16


@pytest.mark.parametrize("device, backend, why", [
    (CPU, "torch", "no GPU: shards are read and decoded by DataLoader worker processes"),
    (GPU, "dali", "shards are read and decoded on the GPU by NVIDIA DALI"),
])
def test_auto_choice_for_shards(device, backend, why):
    assert choose("auto", "shards", device) == (backend, why)


def dali_indexes(tars: list[Path], folder: Path) -> list[str]:
    """DALI's indexes of `tars`, made by its own `wds2idx` into `folder`, as a user's own
    DALI pipeline makes them (docs/your-data.md)."""
    made = []
    for tar in tars:
        made.append(str(folder / tar.with_suffix(".idx").name))
        subprocess.run([str(Path(sys.executable).with_name("wds2idx")), str(tar), made[-1]],
                       check=True, capture_output=True, timeout=60)
    return made


def test_dalis_webdataset_reader_reads_our_shards(shard_folder, tmp_path):
    """A user's own DALI pipeline reads the shards with fn.readers.webdataset: the same
    images and classes as our index names."""
    from nvidia.dali import fn, pipeline_def

    from workload.data.shardformat import read_index, read_manifest

    entry = read_manifest(shard_folder)["splits"]["val"]["shards"][3]
    rows = read_index(shard_folder, "val", entry)
    tar = shard_folder / entry["name"]

    @pipeline_def(batch_size=len(rows), num_threads=1, device_id=None)
    def pipeline():
        images, classes = fn.readers.webdataset(
            paths=[str(tar)], index_paths=dali_indexes([tar], tmp_path), ext=["jpg", "cls"],
            random_shuffle=False)
        return images, classes

    pipe = pipeline()
    pipe.build()
    images, classes = pipe.run()
    assert [bytes(classes.at(i)).decode() for i in range(len(rows))] == \
        [str(row[4]) for row in rows]
    data = tar.read_bytes()
    assert bytes(images.at(0)) == data[rows[0][2]:rows[0][2] + rows[0][3]]


def test_dalis_own_reader_is_exact_only_at_one_number_of_ranks(shard_folder, tmp_path):
    """Why shards are fed to DALI by our ShardSource rather than read by DALI's
    fn.readers.webdataset (dali.py): its reader checkpoint resumes exactly, but ranks
    (shard_id of num_shards) read contiguous ranges of the samples, so the global batches
    of 2 ranks are not the sequence 1 rank reads; ours are."""
    from nvidia.dali import fn, pipeline_def

    tars = sorted(shard_folder.glob("train-*.tar"))
    indexes = dali_indexes(tars, tmp_path)

    @pipeline_def(batch_size=8, num_threads=1, device_id=None)
    def reader(shard_id, num_shards):
        images, _ = fn.readers.webdataset(
            paths=[str(t) for t in tars], index_paths=indexes,
            ext=["jpg", "cls"], shard_id=shard_id, num_shards=num_shards,
            random_shuffle=True, initial_fill=32)
        return images

    def read(pipe, batches: int) -> list[list[bytes]]:
        return [[bytes(images.at(i)) for i in range(len(images))]
                for images in (pipe.run()[0] for _ in range(batches))]

    def built(shard_id=0, num_shards=1, checkpoint=None):
        pipe = reader(shard_id, num_shards, seed=3, enable_checkpointing=True,
                      checkpoint=checkpoint)
        pipe.build()
        return pipe

    one = [image for batch in read(built(), 6) for image in batch]
    two = [read(built(rank, 2), 3) for rank in (0, 1)]
    dealt = [image for pair in zip(*two) for batch in pair for image in batch]
    assert set(dealt) != set(one)  # other samples in the first 48, not only another order
    pipe = built()
    read(pipe, 2)
    saved = pipe.checkpoint()
    assert read(pipe, 3) == read(built(checkpoint=saved), 3)
