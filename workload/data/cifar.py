"""CIFAR-100: found in --data-dir (or downloaded with --download), its 'python version'
files (pickles) read without letting them run code or make the reader allocate more than
such a file can hold.

Three checks, each before anything large is allocated:

1. the file is no larger than MAX_FILE_BYTES;
2. every opcode's argument lies inside the file (`check_opcodes`): Python's unpickler
   allocates a bytes object of the length an opcode declares before reading it, so 20
   bytes could ask for 9 GiB;
3. the unpickler itself builds only dicts, lists, tuples, bytes, strings and numbers: the
   globals it may name are numpy's array and dtype reconstructors and `_codecs.encode`,
   and each comes back as a plan (`ArrayPlan`), made into an array only once its shape and
   type are checked against the bytes it holds (`array_of`).
"""

from __future__ import annotations

import io
import math
import pickle
import pickletools
from pathlib import Path

import numpy as np
import torch

from workload.data.datasets import ArrayDataset, SplitDataset
from workload.errors import UsageError
from workload.files import unwritable_reason

MAX_ROWS = 50_000  # images in CIFAR-100's training file (its test file holds 10,000)
ROW_BYTES = 3 * 32 * 32
# Python 3 writes a byte above 127 as two at protocol 2 (_codecs.encode of a str): room
# for that, the labels and the file names.
MAX_FILE_BYTES = 2 * MAX_ROWS * ROW_BYTES + (32 << 20)
DTYPES = {"u1", "i1", "u2", "i2", "u4", "i4", "u8", "i8", "b1"}


class HostileFile(ValueError):
    """What makes a file no CIFAR file, in one line."""


def _argument_kinds() -> list:
    """For each opcode byte: None (unknown), a fixed size, "line", "lines2" or the size of
    the length prefix as a negative number."""
    kinds: list = [None] * 256
    prefix = {pickletools.TAKEN_FROM_ARGUMENT1: -1, pickletools.TAKEN_FROM_ARGUMENT4: -4,
              pickletools.TAKEN_FROM_ARGUMENT4U: -4, pickletools.TAKEN_FROM_ARGUMENT8U: -8}
    for op in pickletools.opcodes:
        arg = op.arg
        if arg is None:
            kind = 0
        elif arg.n == pickletools.UP_TO_NEWLINE:
            kind = "lines2" if arg.name.endswith("_pair") else "line"
        else:
            kind = prefix.get(arg.n, arg.n)
        kinds[ord(op.code.encode("latin-1"))] = kind
    return kinds


KINDS = _argument_kinds()
STOP = pickle.STOP[0]


def check_opcodes(data: bytes) -> None:
    """Walk the opcodes up to STOP: each must be known and its argument inside `data`."""
    pos = 0
    end = len(data)
    while pos < end:
        code = data[pos]
        kind = KINDS[code]
        pos += 1
        if code == STOP:
            return
        if kind is None:
            raise HostileFile(f"unknown pickle opcode {code:#04x} at byte {pos - 1}")
        if kind == "line":
            pos = data.index(b"\n", pos) + 1
        elif kind == "lines2":
            pos = data.index(b"\n", data.index(b"\n", pos) + 1) + 1
        elif kind < 0:
            length = int.from_bytes(data[pos:pos - kind], "little")
            pos += -kind + length
        else:
            pos += kind
        if pos > end:
            raise HostileFile(f"an opcode at byte {pos - 1} declares more data than the "
                              f"file's {end} bytes")
    raise HostileFile("the pickle has no end (STOP)")


class ArrayPlan:
    """An ndarray as the pickle describes it: (version, shape, dtype, fortran, bytes)."""

    def __init__(self, state: tuple | None = None):
        self.state = state

    def __setstate__(self, state) -> None:  # pickle's BUILD
        self.state = state


class DtypePlan:
    def __init__(self, spec, align=False, copy=False):
        self.spec = spec.decode("latin-1") if isinstance(spec, bytes) else spec
        self.order = "|"

    def __setstate__(self, state) -> None:
        order = state[1] if isinstance(state, tuple) and len(state) > 1 else "|"
        self.order = order.decode("latin-1") if isinstance(order, bytes) else order

    def dtype(self) -> np.dtype:
        if self.spec not in DTYPES or self.order not in ("<", ">", "|", "="):
            raise HostileFile(f"an array of type {self.spec!r} {self.order!r}: a CIFAR file "
                              "holds bytes and integers")
        return np.dtype(self.spec).newbyteorder(self.order if self.order != "|" else "=")


class _NdarrayName:
    """numpy.ndarray as a name _reconstruct receives, never called."""

    __slots__ = ()  # nothing a pickle's BUILD could set


def _reconstruct(cls, shape, typecode) -> ArrayPlan:
    if not isinstance(cls, _NdarrayName):
        raise HostileFile("numpy's _reconstruct of something other than an ndarray")
    return ArrayPlan()


def _frombuffer(buffer, dtype, shape, order) -> ArrayPlan:
    return ArrayPlan((1, shape, dtype, order == "F", buffer))


def _latin1(text, encoding) -> bytes:
    """How protocol 2 stores bytes written by Python 3: encode(str, 'latin1')."""
    if not isinstance(text, str) or encoding not in ("latin1", "latin-1"):
        raise HostileFile(f"_codecs.encode with {encoding!r}: only latin1 text is expected")
    return text.encode("latin-1")


_NUMPY = ("numpy.core.multiarray", "numpy._core.multiarray", "numpy.core.numeric",
          "numpy._core.numeric", "numpy")
STAND_INS = {
    **{(m, "_reconstruct"): _reconstruct for m in _NUMPY},
    **{(m, "_frombuffer"): _frombuffer for m in _NUMPY},
    **{(m, "ndarray"): _NdarrayName for m in _NUMPY},
    **{(m, "dtype"): DtypePlan for m in _NUMPY},
    ("_codecs", "encode"): _latin1,
}


class _PlanningUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        if (module, name) not in STAND_INS:
            raise pickle.UnpicklingError(f"refusing to load {module}.{name}")
        stand_in = STAND_INS[(module, name)]
        if stand_in is _NdarrayName:
            return _NdarrayName()

        def call(*args):  # a new function per name: a BUILD on it changes nothing shared
            return stand_in(*args)
        return call


def load(path: Path):
    """The file's object, its arrays as ArrayPlans (see array_of)."""
    size = path.stat().st_size
    if size > MAX_FILE_BYTES:
        raise HostileFile(f"{size} bytes, more than a CIFAR-100 file holds "
                          f"({MAX_FILE_BYTES} at most)")
    data = path.read_bytes()
    check_opcodes(data)
    return _PlanningUnpickler(io.BytesIO(data), encoding="bytes").load()


def array_of(plan, max_items: int) -> np.ndarray:
    """The array an ArrayPlan describes, once its size is checked against its bytes."""
    state = plan.state if isinstance(plan, ArrayPlan) else None
    if not isinstance(state, tuple) or len(state) != 5:
        raise HostileFile(f"a {type(plan).__name__} where an array was expected")
    _, shape, dtype, fortran, raw = state
    if not (isinstance(shape, tuple) and len(shape) <= 2 and isinstance(dtype, DtypePlan)
            and all(type(n) is int and n >= 0 for n in shape)
            and isinstance(raw, (bytes, bytearray))):
        raise HostileFile(f"an array of shape {shape!r} from {type(raw).__name__}")
    dtype = dtype.dtype()
    count = math.prod(shape)
    if count > max_items or count * dtype.itemsize != len(raw):
        raise HostileFile(f"an array of shape {shape} from {len(raw)} bytes (at most "
                          f"{max_items} values fit a CIFAR-100 file)")
    return np.frombuffer(raw, dtype).reshape(shape, order="F" if fortran else "C")


def labels_of(value) -> np.ndarray:
    """A list of label numbers (or a 1-D integer array) as int64, its length checked first."""
    if isinstance(value, ArrayPlan):
        return array_of(value, MAX_ROWS).astype(np.int64).reshape(-1)
    if (not isinstance(value, list) or len(value) > MAX_ROWS
            or not all(type(v) is int for v in value)):
        raise HostileFile(f"labels as a {type(value).__name__}: a list of at most "
                          f"{MAX_ROWS} integers was expected")
    return np.array(value, dtype=np.int64)


def images_of(value) -> np.ndarray:
    """The N x 3072 uint8 pixel rows, N at most MAX_ROWS."""
    rows = array_of(value, MAX_ROWS * ROW_BYTES)
    if rows.dtype != np.uint8 or rows.ndim != 2 or rows.shape[1] != ROW_BYTES:
        raise HostileFile(f"images of shape {rows.shape} and type {rows.dtype}: "
                          f"N x {ROW_BYTES} bytes were expected")
    return rows


CIFAR100_FOLDER = "cifar-100-python"


def find_cifar100(data_dir: str) -> Path:
    """The cifar-100-python folder inside `data_dir` (or `data_dir` itself)."""
    root = Path(data_dir).expanduser()
    for candidate in (root / CIFAR100_FOLDER, root):
        if (candidate / "train").is_file() and (candidate / "test").is_file():
            return candidate
    raise UsageError(
        f"CIFAR-100 not found: looked for {root / CIFAR100_FOLDER}/train and /test. "
        f"Compute nodes usually have no internet: on a login node run "
        f"'train --dataset cifar100 --data-dir {root} --download --prepare-data' "
        f"(or python -c \"import torchvision; torchvision.datasets.CIFAR100('{root}', "
        f"download=True)\"), then point --data-dir at that folder")


def read_cifar100_split(path: Path) -> ArrayDataset:
    """Read one file of the 'CIFAR-100 python version' straight into uint8 tensors, with
    no code run and nothing allocated beyond what such a file holds (see `load`)."""
    try:
        entry = load(path)
        data = images_of(entry[b"data"])
        labels = labels_of(entry[b"fine_labels"])
        images = torch.from_numpy(data.reshape(-1, 3, 32, 32).copy())
    except (OSError, pickle.UnpicklingError, EOFError, KeyError, ValueError, TypeError,
            AttributeError, IndexError, OverflowError) as error:
        raise UsageError(
            f"{path} is not a readable CIFAR-100 python file ({type(error).__name__}: {error}); "
            f"delete the folder and fetch it again with --download") from None
    if (len(images) != len(labels) or labels.size == 0 or labels.max() >= 100
            or labels.min() < 0):
        span = f"{labels.min()}..{labels.max()}" if labels.size else "?"
        raise UsageError(f"{path} holds {len(images)} images and {len(labels)} labels in "
                         f"{span} (CIFAR-100 has labels 0..99): not CIFAR-100; "
                         "fetch it again with --download")
    return ArrayDataset(images, torch.from_numpy(labels), num_classes=100)


def download_cifar100(data_dir: str) -> None:
    import torchvision  # only needed for the download

    if problem := unwritable_reason(Path(data_dir).expanduser(), create=True):
        raise UsageError(f"--download: CIFAR-100 cannot be downloaded into --data-dir "
                         f"{data_dir} ({problem}); pass a folder you can write to")
    try:
        torchvision.datasets.CIFAR100(str(Path(data_dir).expanduser()), download=True)
    except Exception as error:  # network errors come in many types
        raise UsageError(f"downloading CIFAR-100 into {data_dir} failed ({error}); "
                         "run --download on a machine with internet access") from None


def load_cifar100(data_dir: str, download: bool = False) -> SplitDataset:
    if download:
        download_cifar100(data_dir)
    folder = find_cifar100(data_dir)
    return SplitDataset(read_cifar100_split(folder / "train"),
                        read_cifar100_split(folder / "test"))
