"""What the image tests share: building with podman/buildah on the stand-in bases, running
commands inside a built image, and reading what changed in its filesystem."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from tests.helpers import REPO

ROOT = REPO
SCRIPTS = ROOT / "tests" / "image"
CACHE = Path(os.environ.get("HPC_TRAIN_CACHE", Path.home() / ".cache" / "hpc-train"))
UNPRIVILEGED = "4242:4242"
# The most the project's layers may add over the base (issue 14: the digits data ships in
# the package, so scipy and scikit-learn no longer come along).
MAX_ADDED_BYTES = 50e6
STEPS = 3
TRAIN = ["train", "--dataset", "digits", "--device", "cpu", "--epochs", "1",
         "--max-steps", str(STEPS), "--output-dir", "/out/run"]
# Paths that buildah run mounts or generates for every command: not the image's rootfs.
RUNTIME_PATHS = ("proc", "sys", "dev", "run", "tmp", "out", "etc/hosts", "etc/resolv.conf",
                 "etc/hostname", ".marker")


def containers_env() -> dict[str, str]:
    return dict(os.environ,
                CONTAINERS_STORAGE_CONF=str(CACHE / "containers" / "storage.conf"),
                BUILDAH_ISOLATION="chroot")


def run(cmd: list[str], check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(c) for c in cmd], env=containers_env(), text=True,
                          capture_output=True)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(map(str, cmd))} exited {proc.returncode}\n"
                             f"--- stdout\n{proc.stdout[-4000:]}\n"
                             f"--- stderr\n{proc.stderr[-4000:]}")
    return proc


@dataclass
class Built:
    tag: str
    base: str
    container: str
    rootfs: Path
    config: dict
    base_config: dict
    seconds: dict
    log: str = ""  # this build's output: a step taken from the layer cache prints nothing
    record: str = ""  # what install-workload.sh's steps said, kept in the image


def remove_leftovers() -> None:
    """Images and containers of earlier runs that were killed: 7 GB each with vfs.

    Named after the pid of the run that made them; those of live runs stay, and so do the
    cached builds (named after their inputs, see `inputs_key`).
    """
    def dead(name: str) -> bool:
        pid = name.rsplit("-", 1)[-1].rsplit(":", 1)[-1]
        # A pid has at most 7 digits; a cached build's 16-digit hash is never one.
        return pid.isdigit() and len(pid) <= 7 and not Path(f"/proc/{pid}").exists()

    containers = run(["buildah", "containers", "--format", "{{.ContainerName}}"]).stdout.split()
    for name in containers:
        if name.startswith("hpc-train-test-") and dead(name):
            run(["buildah", "rm", name], check=False)
    for ref in suite_images():
        if dead(ref):
            run(["podman", "rmi", "--force", ref], check=False)


def suite_images() -> list[str]:
    """The images in the suite's repository: every build of every session, cached or not."""
    return run(["podman", "images", "--format", "{{.Repository}}:{{.Tag}}",
                "--filter", f"reference={REPOSITORY}"]).stdout.split()


# What the Dockerfile's build reads (.dockerignore lets only these into the context) and
# the scripts that drive it: a change to any of them builds the project image again.
IMAGE_INPUTS = ("Dockerfile", ".dockerignore", "pyproject.toml", "README.md", "LICENSE",
                "NOTICE", "workload", "entrypoint.sh", "container/install-workload.sh",
                "jobs", "examples", "tests/image/build_image.sh", "tests/image/containers.sh")
REPOSITORY = "localhost/hpc-train/test-image"
# Where container/install-workload.sh keeps what its steps said, in the image.
INSTALL_RECORD = "opt/hpc-train/install.log"


def inputs_key(base_digest: str, *settings: str) -> str:
    """A hash of the image's inputs: the files the build copies (content and mode), the
    base's digest and the build's settings. Git lists the files (tracked or not, less what
    .gitignore names), so a dirty working tree is hashed as it is."""
    listed = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-co", "--exclude-standard",
                             "-z", "--", *IMAGE_INPUTS], capture_output=True, check=True)
    digest = hashlib.sha256("\0".join([base_digest, *settings]).encode())
    for name in sorted(set(filter(None, listed.stdout.decode().split("\0")))):
        path = ROOT / name
        if path.is_file() and "__pycache__" not in path.parts:
            digest.update(f"\0{name}\0{path.stat().st_mode & 0o111}\0".encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def inspect(ref: str) -> dict:
    return json.loads(run(["podman", "image", "inspect", ref]).stdout)[0]


def run_inside(image: Built, argv: list[str], out: Path, user: str | None = None):
    """Runs argv in the image with HOME unset, out at /out and a fresh /tmp.

    Returns the process and the paths of the image's own filesystem that changed.
    """
    tmp = out.parent / f"{out.name}-tmp"
    for folder, mode in ((out, 0o777), (tmp, 0o1777)):
        folder.mkdir(parents=True, exist_ok=True)
        folder.chmod(mode)
    mounts = ["-v", f"{out}:/out", "-v", f"{tmp}:/tmp"]
    run(["buildah", "run", *mounts, image.container, "--", "true"])  # mount points exist now
    marker = image.rootfs / ".marker"
    marker.touch()
    time.sleep(1.1)  # mtimes have one-second resolution on some filesystems
    user_flag = ["--user", user] if user else []
    proc = run(["buildah", "run", *user_flag, *mounts, image.container, "--",
                "env", "-u", "HOME", *argv], check=False)
    return proc, changed_paths(image.rootfs, marker)


def changed_paths(rootfs: Path, marker: Path) -> list[str]:
    since = marker.stat().st_mtime
    changed = []
    for folder, dirs, files in os.walk(rootfs):
        rel = Path(folder).relative_to(rootfs)
        dirs[:] = [d for d in dirs if str(rel / d) not in RUNTIME_PATHS]
        for name in files + dirs:
            path = Path(folder) / name
            if str(rel / name) not in RUNTIME_PATHS and path.lstat().st_mtime > since:
                changed.append(str(rel / name))
    return changed


def entrypoint(image: Built) -> list[str]:
    return image.config["Config"]["Entrypoint"]


def build(kind: str, *build_args: str, arch: str = "amd64"):
    """Builds the Dockerfile on the `kind` stand-in base (ngc, bare; arm64 for arch arm64);
    yields it as a Built with a mounted working container, removed afterwards.

    The image itself is kept, tagged with a hash of its inputs, and reused by later runs
    until an input changes (then the stale one is removed): a fresh machine builds it.
    """
    started = time.monotonic()
    base_script = ["build_arm64_base.sh"] if arch == "arm64" else ["build_base.sh", kind]
    base = run([SCRIPTS / base_script[0], *base_script[1:]]).stdout.split()[-1]
    base_ready = time.monotonic()
    remove_leftovers()
    base_config = inspect(base)
    key = inputs_key(base_config["Digest"], kind, arch, *build_args)
    tag, log_file = f"{REPOSITORY}:{kind}-{key}", CACHE / "image-logs" / f"{kind}-{key}.log"
    log_file.parent.mkdir(parents=True, exist_ok=True)
    # Two xdist workers may need one image (the registry tests push the amd64 one the
    # build tests use): the second waits for the first's build and reuses it.
    with open(log_file.with_name(f"{kind}.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (run(["podman", "image", "exists", tag], check=False).returncode == 0
                and log_file.exists()):
            proc = run(["env", f"BUILD_PLATFORM=linux/{arch}", f"INPUTS_KEY={key}",
                        SCRIPTS / "build_image.sh", base, tag, *build_args])
            log_file.write_text(proc.stdout + proc.stderr)
            for stale in suite_images():
                if stale.startswith(f"{REPOSITORY}:{kind}-") and stale != tag:
                    run(["podman", "rmi", "--force", stale], check=False)
    built = time.monotonic()
    container = run(["buildah", "from", "--pull-never", "--arch", arch, "--name",
                     f"hpc-train-test-{kind}-{os.getpid()}", tag]).stdout.strip()
    try:
        rootfs = Path(run(["buildah", "mount", container]).stdout.strip())
        yield Built(tag, base, container, rootfs, inspect(tag), base_config,
                    {"base": base_ready - started, "build": built - base_ready,
                     "container": time.monotonic() - built}, log_file.read_text(),
                    (rootfs / INSTALL_RECORD).read_text())
    finally:
        run(["buildah", "rm", container], check=False)


def canonical(name: str) -> str:
    """A distribution's name as PEP 503 compares them: python_hostlist, Python.Hostlist and
    python-hostlist are one (which spelling pip prints depends on the release's metadata)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def installed_by(log: str) -> dict[str, str]:
    """{canonical name: version} from the `install-workload: installed: ...` lines of a
    build's record (one line per install step, `name==version` items)."""
    found = {}
    for line in log.splitlines():
        _, marker, items = line.partition("install-workload: installed: ")
        for item in items.split() if marker else ():
            name, _, version = item.partition("==")
            found[canonical(name)] = version
    return found
