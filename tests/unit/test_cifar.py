"""The CIFAR-100 reader on files written here in the real 'python version' format."""

import os
import pickle

import pytest

from tests.helpers import write_cifar100
from workload.data.cifar import find_cifar100, load_cifar100, read_cifar100_split
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


class Reduces:
    """An object pickled as a call of `function` with `args`."""

    def __init__(self, function, *args):
        self.function, self.args = function, args

    def __reduce__(self):
        return self.function, self.args


def nested_rows(levels: int, width: int) -> list:
    """A list `levels` deep of `width` references to one list: a few KB pickled (the
    pickle's memo), width ** levels values once numpy flattens it."""
    rows = [0] * 3072
    for _ in range(levels):
        rows = [rows] * width
    return rows


HOSTILE = {  # each small on disk, each asking for gigabytes when loaded as it says
    "ndarray called with a huge shape": lambda np: {
        b"data": Reduces(np.ndarray, (100_000, 100_000)), b"fine_labels": [1]},
    "_reconstruct of a huge shape": lambda np: {
        b"data": Reduces(np_reconstruct(np), np.ndarray, (3 << 30,), b"b"),
        b"fine_labels": [1]},
    "pixel rows as a list of shared lists": lambda np: {
        b"data": nested_rows(2, 1500), b"fine_labels": [1]},
    "labels as a list of shared lists": lambda np: {
        b"data": np.zeros((1, 3072), np.uint8), b"fine_labels": nested_rows(2, 700)[0]},
}


def np_reconstruct(np):
    core = getattr(np, "_core", None) or np.core
    return core.multiarray._reconstruct


READ_UNDER_A_MEMORY_LIMIT = """
import resource, sys
from pathlib import Path
from workload.data.cifar import read_cifar100_split
from workload.errors import UsageError
# What the process maps now (torch included) and 1 GiB more: a reader that builds what a
# hostile file declares fails here with MemoryError instead of taking the machine down.
mapped = int(open("/proc/self/statm").read().split()[0]) * resource.getpagesize()
resource.setrlimit(resource.RLIMIT_AS, (mapped + (1 << 30), resource.RLIM_INFINITY))
for path in sys.argv[1:]:
    try:
        print("read", len(read_cifar100_split(Path(path))))
    except UsageError as error:
        print("refused", error)
    except MemoryError:
        print("MemoryError")
"""


def read_in_a_subprocess(paths) -> list[str]:
    """What reading each file gives, in one process (torch loads once) under a memory limit."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", READ_UNDER_A_MEMORY_LIMIT, *map(str, paths)],
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.splitlines()


def test_hostile_pickles_of_allowed_types_are_refused_before_allocating(tmp_path):
    import struct

    import numpy as np

    files = [write_cifar100(tmp_path) / "train"]  # a real one reads under the limit
    for k, form in enumerate(HOSTILE.values()):
        files.append(tmp_path / f"hostile{k}")
        files[-1].write_bytes(pickle.dumps(form(np), protocol=2))
    # BINBYTES8, BYTEARRAY8, BINUNICODE8 declaring 9 GiB in a file of 100 bytes.
    for opcode in (b"\x8e", b"\x96", b"\x8d"):
        files.append(tmp_path / f"declares{opcode.hex()}")
        files[-1].write_bytes(b"\x80\x05" + opcode + struct.pack("<Q", 9 << 30) + b"x" * 100
                              + b".")
    assert all(path.stat().st_size < 600_000 for path in files)
    said = read_in_a_subprocess(files)
    assert said[0] == "read 20" and len(said) == len(files), said
    for path, line in zip(files[1:], said[1:]):
        assert line.startswith(f"refused {path} is not a readable CIFAR-100 python file"), line
    assert all("declares more data than the file's" in line for line in said[-3:]), said


def python2_cifar_pickle(rows, labels) -> bytes:
    """The official files' form, written by hand: Python 2's cPickle at protocol 2, the
    pixels as one str (BINSTRING) in numpy.core.multiarray's _reconstruct, the dtype's
    state with str fields."""
    import struct

    def short(text: bytes) -> bytes:  # SHORT_BINSTRING
        return b"U" + bytes([len(text)]) + text

    raw = rows.tobytes()
    dtype = (b"cnumpy\ndtype\n" + short(b"u1") + b"K\x00K\x01\x87R" + b"(K\x03" + short(b"|")
             + b"NNNJ\xff\xff\xff\xffJ\xff\xff\xff\xffK\x00tb")
    array = (b"cnumpy.core.multiarray\n_reconstruct\n" + b"cnumpy\nndarray\n" + b"K\x00\x85"
             + short(b"b") + b"\x87R" + b"(K\x01M" + struct.pack("<H", rows.shape[0])
             + b"M\x00\x0c\x86" + dtype + b"\x89T" + struct.pack("<I", len(raw)) + raw + b"tb")
    label_list = b"](" + b"".join(b"K" + bytes([v]) for v in labels) + b"e"
    return (b"\x80\x02}(" + short(b"data") + array + short(b"fine_labels") + label_list
            + b"u.")


def test_reads_the_python_2_form_of_the_official_files(tmp_path):
    import numpy as np

    rows = np.random.default_rng(1).integers(0, 256, (3, 3072), dtype=np.uint8)
    path = tmp_path / "train"
    path.write_bytes(python2_cifar_pickle(rows, [3, 99, 0]))
    with open(path, "rb") as f:  # the hand-written form is what pickle itself reads
        assert (pickle.load(f, encoding="bytes")[b"data"] == rows).all()
    split = read_cifar100_split(path)
    assert split.images.reshape(3, -1).numpy().tolist() == rows.tolist()
    assert split.labels.tolist() == [3, 99, 0]
