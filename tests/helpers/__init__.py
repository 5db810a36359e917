"""What several test modules share: paths, tiny training arguments, running `train` in this
process, a clean launch environment, files in real formats. Tests import from here, never
from each other. The scripts tests run as processes (torchrun's, a user's loop) are in
tests/scripts; the SLURM jobs' helpers in tests/slurm; the site twins' in tests/twins."""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import random
import socket
import subprocess
import sys
import time
from pathlib import Path

from workload.files import proc_stat_fields
from workload.launch.variables import PORT_BASE

TESTS = Path(__file__).resolve().parents[1]
REPO = TESTS.parent

# A model small enough that a few steps take well under a second on a 2-core CPU.
TINY = ["--model", "wrn", "--width", "8", "--blocks-per-stage", "1", "--device", "cpu"]
# A short run that checkpoints every 2 steps, for the checkpoint and resume tests.
CHECKPOINT_ARGS = [*TINY, "--dataset", "synthetic", "--synthetic-size", "128",
                   "--image-size", "16", "--num-classes", "4", "--batch-size", "16",
                   "--epochs", "2", "--seed", "5", "--checkpoint-every", "2"]
# Small doctor probes keep the suite fast on 2 cores; the figures are not asserted.
# Tiny and quick, but real data: digits at 16 px, a few steps (the session's `digits_run`).
DIGITS_RUN = [*TINY, "--dataset", "digits", "--image-size", "16", "--batch-size", "64",
              "--epochs", "1", "--max-steps", "6", "--seed", "3"]
DOCTOR_FAST = ["--probe-mib", "1", "--probe-iters", "2", "--timeout", "60",
               "--sweep-max-mib", "2", "--pair-max-mib", "2"]


def run_train(args: list[str], out: Path) -> dict:
    """Run `train ARGS --output-dir OUT` in this process; return its summary.json."""
    from workload.train import main as train_main

    train_main([*args, "--output-dir", str(out)])
    return json.loads((out / "summary.json").read_text())


def parameter_digest(model) -> str:
    """sha256 over a plain model's parameters by name: what rank_probe.py prints per rank
    (it runs as a script under torchrun, so it keeps its own copy, which gathers shards)."""
    import hashlib

    import torch

    digest = hashlib.sha256()
    for name, param in model.named_parameters():
        tensor = param.detach().cpu().contiguous()
        digest.update(name.encode() + tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def pickles_and_zips(folder: Path) -> list[str]:
    """Files under `folder` that start like a pickle (0x80, protocol 2 and later) or a zip
    archive (what torch.save writes): a run folder holds none. A safetensors file counts
    only when safetensors cannot read it: it starts with its header's length, and 0x80 is
    as likely a first byte as any."""
    from safetensors import safe_open

    found = []
    for path in sorted(folder.rglob("*")):
        if path.is_file() and not path.is_symlink():
            with open(path, "rb") as f:
                head = f.read(4)
            if head[:1] == b"\x80" or head == b"PK\x03\x04":
                try:
                    with safe_open(path, "pt"):
                        continue
                except Exception:  # noqa: BLE001 (whatever it is, it is not safetensors)
                    found.append(str(path.relative_to(folder)))
    return found


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


# Where free_ports draws: below the range SLURM jobs derive MASTER_PORT from (PORT_BASE to
# PORT_LAST) and below the kernel's ephemeral range (32768 and up).
PORTS = range(10000, PORT_BASE)
# The OS's randomness: a training in a test process seeds Python's `random` alike in
# every xdist worker, which would draw the same ports and job ids.
DRAW = random.SystemRandom()


def free_ports(count: int) -> list[int]:
    """Ports free right now (held open together so they differ), from PORTS: a port from
    the ephemeral range can be taken, between this check and the server's bind, as the
    local end of any outgoing connection (a gloo mesh, a store client, an RPC of another
    worker's cluster); a port from PORTS only by a bind that asks for it."""
    sockets: list[socket.socket] = []
    try:
        while len(sockets) < count:
            sock = socket.socket()
            try:
                sock.bind(("127.0.0.1", DRAW.choice(PORTS)))
            except OSError:  # in use: draw another
                sock.close()
                continue
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def free_port() -> int:
    """A port free right now (for a rendezvous of this test's own): see free_ports."""
    return free_ports(1)[0]


def listening(port: int, host: str = "127.0.0.1") -> bool:
    """Whether something accepts connections there (a rank 0 waiting in its rendezvous)."""
    with socket.socket() as s:
        return s.connect_ex((host, port)) == 0


def clean_env() -> dict[str, str]:
    """No launch variables from the calling shell (a CI job may run inside SLURM)."""
    drop = ("SLURM_", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_",
            "TORCHELASTIC_", "PET_", "GROUP_RANK", "NODE_RANK", "OMP_NUM_THREADS", "LOCAL_GPU")
    return {k: v for k, v in os.environ.items() if not k.startswith(drop)}


def local_rank_env(rank: int, world: int, port: int) -> dict[str, str]:
    """clean_env() with the torch.distributed variables of one of `world` ranks started by
    hand on this host (as a user would), one thread each."""
    return {**clean_env(), "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world),
            "LOCAL_WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def by_check(data: dict, check: str) -> list[dict]:
    """The findings of one doctor check in its JSON report."""
    return [f for f in data["findings"] if f["check"] == check]


class Python2Pickler(pickle._Pickler):
    """Protocol 2 as Python 2 wrote the published CIFAR files: its strings (bytes here)
    as BINSTRING, which Python 3 reads as str under encoding="latin1" (torchvision's
    reader) and as bytes under encoding="bytes" (ours)."""

    dispatch = dict(pickle._Pickler.dispatch)

    def save_python2_string(self, text: bytes) -> None:
        if len(text) < 256:
            self.write(pickle.SHORT_BINSTRING + bytes([len(text)]) + text)
        else:
            self.write(pickle.BINSTRING + len(text).to_bytes(4, "little") + text)
        self.memoize(text)

    dispatch[bytes] = save_python2_string


def write_cifar100(root: Path, n_train: int = 20, n_test: int = 10) -> Path:
    """Files laid out and pickled as the official cifar-100-python.tar.gz holds them."""
    # numpy (and PIL below) where used: the twins' stand-ins import this package in each
    # command they stand in for (hundreds a run), and numpy cost each a tenth of a CPU-second.
    import numpy as np
    folder = root / "cifar-100-python"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for split, n in (("train", n_train), ("test", n_test)):
        entry = {
            b"filenames": [f"img{i}.png".encode() for i in range(n)],
            b"batch_label": f"{split} batch".encode(),
            b"fine_labels": rng.integers(0, 100, n).tolist(),
            b"coarse_labels": rng.integers(0, 20, n).tolist(),
            b"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8),
        }
        with open(folder / split, "wb") as f:
            Python2Pickler(f, protocol=2).dump(entry)  # the protocol of the published files
    with open(folder / "meta", "wb") as f:
        Python2Pickler(f, protocol=2).dump({
            b"fine_label_names": [f"class{k}".encode() for k in range(100)],
            b"coarse_label_names": [f"group{k}".encode() for k in range(20)]})
    return folder


def write_image_folder(root: Path, classes: int = 2, per_class: int = 8, size=(40, 48),
                       splits: tuple[str, ...] = ("train", "val")) -> Path:
    """An image folder dataset of small random JPEGs: root/<split>/<class>/<i>.jpg, the
    classes named cat, dog, class2, ...; `size` is a side or (height, width)."""
    import numpy as np  # where used: see write_cifar100
    from PIL import Image

    height, width = (size, size) if isinstance(size, int) else size
    names = ["cat", "dog", *(f"class{k}" for k in range(2, classes))][:classes]
    rng = np.random.default_rng(0)
    for split in splits:
        for name in names:
            folder = root / split / name
            folder.mkdir(parents=True)
            for i in range(per_class):
                pixels = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
                Image.fromarray(pixels).save(folder / f"{i}.jpg", quality=90)
    return root


def tar_folder(folder: Path, tar_path: Path) -> Path:
    """`folder` packed as tar_path with its name as the one top folder (pets/train/...)."""
    import tarfile

    with tarfile.open(tar_path, "w") as tar:
        tar.add(folder, arcname=folder.name)
    return tar_path


def tar_member(name: str, kind: bytes | None = None, target: str = ""):
    """A tar header of `name`: a regular file unless `kind` (a tarfile type) says else,
    `target` a link's; mode 0644."""
    import tarfile

    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.mode = kind or tarfile.REGTYPE, target, 0o644
    return info


def tar_with(path: Path, *members, data: bytes = b"abc") -> Path:
    """A tar at `path` of `members` (tar_member's), each regular file holding `data`."""
    import io
    import tarfile

    with tarfile.open(path, "w") as tar:
        for member in members:
            member.size = len(data) if member.isfile() else 0
            tar.addfile(member, io.BytesIO(data) if member.isfile() else None)
    return path


def wait_for(predicate, what: str, log: Path, timeout: float = 240, poll: float = 0.5) -> None:
    """Poll `predicate` until it holds; on timeout fail with the end of the job's log."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(poll)
    text = log.read_text() if log.exists() else "(no log)"
    raise AssertionError(f"timed out waiting for {what}; job log:\n{text[-4000:]}")


@contextlib.contextmanager
def tmpfs(path: Path, *options: str):
    """A real tmpfs mounted for the test (CI runs as root), unmounted afterwards."""
    path.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", ",".join(options), "tmpfs", str(path)],
                   check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", str(path)], check=True)


@contextlib.contextmanager
def vfat(path: Path, image: Path):
    """A real FAT file system (no hard links) mounted at `path` from the file `image`: the
    kernel's vfat where it has one, else fusefat (containers often lack the vfat module).
    mkfs.vfat and fusefat come from tools/debian-packages.txt; mounting needs root."""
    subprocess.run(["truncate", "-s", "16M", str(image)], check=True)
    subprocess.run(["mkfs.vfat", str(image)], check=True, capture_output=True)
    path.mkdir()
    kernel = subprocess.run(["mount", "-o", "loop", str(image), str(path)], capture_output=True)
    if kernel.returncode != 0:
        subprocess.run(["fusefat", "-o", "rw+", str(image), str(path)], check=True,
                       capture_output=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", str(path)], check=True)


@contextlib.contextmanager
def ext4(path: Path, image: Path, *options: str):
    """A real ext4 file system mounted at `path` from the file `image` (a loop device:
    root) with mount `options`, unmounted afterwards; `fsfreeze -f` on it blocks every
    writer, as a hung Lustre or NFS server does. It is thawed first: a frozen file system
    would block the umount."""
    subprocess.run(["truncate", "-s", "64M", str(image)], check=True)
    subprocess.run(["mkfs.ext4", "-q", str(image)], check=True)
    path.mkdir()
    subprocess.run(["mount", "-o", ",".join(("loop", *options)), str(image), str(path)],
                   check=True)
    try:
        yield path
    finally:
        subprocess.run(["fsfreeze", "-u", str(path)], capture_output=True)  # if frozen
        subprocess.run(["umount", str(path)], check=True)


def writer_of(parent: int) -> int | None:
    """The PID of the background checkpoint writer that `parent` started, if it runs."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or (fields := proc_stat_fields(proc.name)) is None:
            continue
        try:
            argv = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        if int(fields[1]) == parent and b"workload.checkpoint.writer.process" in argv:
            return int(proc.name)
    return None


def started_writer_of(parent: int, timeout: float = 60.0) -> int:
    """The PID of the writer `parent` started, once it runs its module: "handed to the
    writer" is logged as the request is written to its pipe, which may be before the
    writer process is past its exec (under load, a second or more), when its command line
    is still the parent's."""
    deadline = time.monotonic() + timeout
    while (pid := writer_of(parent)) is None:
        assert time.monotonic() < deadline, f"no checkpoint writer of {parent} in {timeout} s"
        time.sleep(0.02)
    return pid


def run_diagnose(run_dir: Path, *flags: str) -> subprocess.CompletedProcess:
    """`diagnose RUN_DIR FLAGS...` as users run it (python -m: this checkout's package),
    its output captured; a traceback fails the test."""
    done = subprocess.run([sys.executable, "-m", "workload.diagnose", str(run_dir), *flags],
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert "Traceback" not in done.stderr, done.stderr
    return done
