"""The CIFAR-100 reader on files written here in the real 'python version' format."""

import os
import pickle

import pytest

from tests.helpers import write_cifar100
from workload.data.datasets import find_cifar100, load_cifar100, read_cifar100_split
from workload.errors import UsageError


def test_reads_images_and_fine_labels_as_uint8(tmp_path):
    folder = write_cifar100(tmp_path)
    split = load_cifar100(str(tmp_path))
    assert split.train.images.shape == (20, 3, 32, 32)
    assert str(split.train.images.dtype) == "torch.uint8"
    assert split.test.images.shape == (10, 3, 32, 32)
    with open(folder / "train", "rb") as f:
        raw = pickle.load(f, encoding="bytes")
    # Row-major 3072 bytes: 1024 red, then green, then blue.
    assert split.train.images[3, 1].flatten().tolist() == raw[b"data"][3, 1024:2048].tolist()
    assert split.train.labels.tolist() == raw[b"fine_labels"]


def test_data_dir_may_point_at_the_cifar_folder_itself(tmp_path):
    folder = write_cifar100(tmp_path)
    assert find_cifar100(str(folder)) == folder


def test_missing_files_name_the_path_and_the_fetch_command(tmp_path):
    with pytest.raises(UsageError) as error:
        load_cifar100(str(tmp_path / "nowhere"))
    message = str(error.value)
    assert str(tmp_path / "nowhere" / "cifar-100-python") in message
    assert "--download" in message


def test_truncated_file_is_a_clear_error(tmp_path):
    folder = write_cifar100(tmp_path)
    data = (folder / "train").read_bytes()
    (folder / "train").write_bytes(data[: len(data) // 2])
    with pytest.raises(UsageError, match="not a readable CIFAR-100"):
        load_cifar100(str(tmp_path))


def test_a_pickle_with_code_is_refused_and_never_runs(tmp_path):
    marker = tmp_path / "pwned"

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    path = tmp_path / "train"
    path.write_bytes(pickle.dumps({b"data": Payload(), b"fine_labels": [1]}))
    with pytest.raises(UsageError, match="refusing to load"):
        read_cifar100_split(path)
    assert not marker.exists()


def test_labels_below_zero_are_refused(tmp_path):
    folder = write_cifar100(tmp_path)
    with open(folder / "train", "rb") as f:
        entry = pickle.load(f, encoding="bytes")
    entry[b"fine_labels"][0] = -3
    with open(folder / "train", "wb") as f:
        pickle.dump(entry, f, protocol=2)
    with pytest.raises(UsageError, match="-3..*labels 0..99"):
        read_cifar100_split(folder / "train")
