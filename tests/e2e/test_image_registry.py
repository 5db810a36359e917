"""From a registry to a running job: the release script pushes and signs, sites pull by
architecture and digest, and the image runs the way Apptainer runs it.

    python -m pytest -m image tests/e2e/test_image_registry.py

tools/release.sh (the publish workflow's own step) pushes the images the other image
tests built (`image`, `arm64_image` in tests/conftest.py) to Debian's docker-registry on
the loopback interface, with a multi-arch index, signed with a session GPG key (GPG simple
signing; the workflow signs keylessly with cosign instead). skopeo pulls under a
policy.json that requires that signature.

The runtime is Charliecloud's ch-run, which has Apptainer's semantics where they matter
here: unprivileged (a user namespace; run here as uid 1000 through setpriv, not as root),
the image read-only, no ENTRYPOINT, the host's environment passed through. Differences,
handled explicitly below:

- Apptainer binds $HOME, the working folder and /tmp by default; ch-run binds /tmp only:
  the work folder is bound with `-b WORK:/workspace -c /workspace` (a bind target must
  exist in the image: /workspace is the Dockerfile's WORKDIR), the home with `--home`.
- Apptainer applies the image's ENV itself; ch-run only with `--set-env` (the image's
  /ch/environment, which ch-convert writes, or a host file: the amd64 image's ENV is
  written to one, see `chrun_image`). Without it the Dockerfile's cache locations under
  /tmp and PYTHONDONTWRITEBYTECODE would be missing, as they would be under Apptainer
  without them.
- ch-run needs $USER set; it has no --nv (no GPU here anyway).
- The directory image is the pulled image's root filesystem mounted by buildah and bound
  at a path uid 1000 can reach, not a copy: `ch-convert -i podman -o dir` (what a site
  would run) gzips an export first, minutes for the 7 GB amd64 image and about three for
  the 0.9 GB arm64 one here; the files ch-run sees are the same.

What it cannot prove: the real Apptainer binary (none for Debian 12), GPUs, a public
registry's authentication, keyless cosign (needs GitHub's OIDC identity).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from tests.helpers import DOCTOR_FAST, REPO, TINY
from tests.helpers.images import run

pytestmark = [pytest.mark.image, pytest.mark.slow, pytest.mark.root]  # bind mounts

VERSION = "0.1.0"
USER_ID = 1000
# A tiny digits run: real data, a few steps (tests/e2e/test_trained_model.py's settings).
DIGITS = ["train", *TINY, "--dataset", "digits", "--image-size", "16", "--batch-size", "64",
          "--epochs", "1", "--max-steps", "6", "--seed", "3"]
# Emulated (arm64 under QEMU) every operation costs ten times more: three steps of 16
# synthetic images and one evaluation batch of 16, not the digits' 64 a step and 360 to
# evaluate (31 CPU-s, not 104, on the 2-core machine; what runs is the same code).
EMULATED = ["train", *TINY, "--dataset", "synthetic", "--synthetic-size", "80",
            "--num-classes", "4", "--image-size", "16", "--batch-size", "16", "--epochs", "1",
            "--max-steps", "3", "--seed", "3"]
OWN_SCRIPT = """\
import torch
import torch.distributed as dist
from workload.launch import setup
launch = setup()
dist.init_process_group("gloo")
total = torch.tensor([float(launch.rank)])
dist.all_reduce(total)
print(f"rank {launch.rank} of {launch.world_size} on {launch.device}: sum {int(total)}")
dist.destroy_process_group()
"""


@pytest.fixture(scope="module")
def released(registry, image, arm64_image) -> dict[str, str]:
    """tools/release.sh pushed and signed both images; {tag or 'index': digest}."""
    started = time.monotonic()
    proc = subprocess.run(
        [REPO / "tools" / "release.sh", "--sign-by", registry.fingerprint,
         "--registries.d", registry.registries_d, "--tls-verify=false",
         f"{registry.host}/hpc-train", VERSION, "cuda13",
         f"amd64=containers-storage:{image.tag}", f"arm64=containers-storage:{arm64_image.tag}"],
        env=registry.env, text=True, capture_output=True, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-3000:]
    pushed = dict(re.findall(r"release\.sh: \S+:([\w.-]+) (sha256:\w+)", proc.stderr))
    pushed["index"] = proc.stdout.split()[-1]
    print(f"\nrelease.sh pushed and signed in {time.monotonic() - started:.0f}s")
    return pushed


def manifest(registry, ref: str) -> dict:
    return json.loads(registry.skopeo("inspect", "--raw", "--tls-verify=false",
                                      f"docker://{registry.host}/{ref}").stdout)


def test_index_has_both_architectures_under_the_documented_tags(registry, released, image,
                                                                arm64_image):
    index = manifest(registry, f"hpc-train:{VERSION}-cuda13")
    assert index["mediaType"] == "application/vnd.oci.image.index.v1+json"
    by_arch = {entry["platform"]["architecture"]: entry for entry in index["manifests"]}
    assert by_arch["amd64"]["digest"] == released[f"{VERSION}-cuda13-a100"]
    assert by_arch["arm64"]["digest"] == released[f"{VERSION}-cuda13-gh200"]
    # Each entry carries its own image's revision (a cached image may predate the other).
    for arch, built in (("amd64", image), ("arm64", arm64_image)):
        revision = built.config["Config"]["Labels"]["org.opencontainers.image.revision"]
        entry = by_arch[arch]
        assert entry["annotations"]["org.opencontainers.image.revision"] == revision
        assert entry["annotations"]["org.opencontainers.image.version"] == VERSION
    assert manifest(registry, f"hpc-train:{VERSION}") == index  # the plain tag: cuda13


def pull(registry, source: str, dest: str, *flags: str) -> subprocess.CompletedProcess:
    return registry.skopeo("copy", "--quiet", "--src-tls-verify=false", *flags,
                           f"docker://{registry.host}/{source}", dest, check=False)


def test_unsigned_or_altered_image_is_refused(registry, released, arm64_image, tmp_path):
    unsigned = f"{registry.host}/unsigned:{VERSION}"
    # --remove-signatures: a pull of the signed release back into the store (the tests
    # below) attaches its signature to the built image, which has the same ID; a later
    # run's push would otherwise stop at "Would invalidate signatures".
    registry.skopeo("copy", "--quiet", "--remove-signatures", "--dest-tls-verify=false",
                    f"containers-storage:{arm64_image.tag}", f"docker://{unsigned}")
    refused = pull(registry, f"unsigned:{VERSION}", f"oci:{tmp_path / 'u'}")
    assert refused.returncode != 0 and "signature" in refused.stderr.lower(), refused.stderr
    # Altered: the amd64 image's valid signature put beside the unsigned image.
    digest = manifest(registry, f"unsigned:{VERSION}")
    altered = registry.signatures / f"unsigned@{digest_of(registry, f'unsigned:{VERSION}')}"
    altered.mkdir(exist_ok=True)
    signed = released[f"{VERSION}-cuda13-a100"].replace(":", "=")
    shutil.copy(registry.signatures / f"hpc-train@{signed}" / "signature-1", altered)
    refused = pull(registry, f"unsigned:{VERSION}", f"oci:{tmp_path / 'a'}")
    assert refused.returncode != 0 and "signature" in refused.stderr.lower(), refused.stderr
    assert digest  # the unsigned image itself is there: only the policy refused it


def digest_of(registry, ref: str) -> str:
    """The manifest digest of REF as the lookaside folder names it (sha256=...)."""
    out = registry.skopeo("inspect", "--tls-verify=false", "--format", "{{.Digest}}",
                          f"docker://{registry.host}/{ref}").stdout.strip()
    return out.replace(":", "=")


# --- pulled as sites pull, run as Apptainer runs --------------------------------------------

CHRUN_ROOT = Path("/var/tmp") / f"hpc-train-chrun-{os.getpid()}"


@pytest.fixture(scope="module", autouse=True)
def remove_chrun_folders():
    yield
    if not any(os.path.ismount(p) for p in CHRUN_ROOT.glob("*/root")):
        shutil.rmtree(CHRUN_ROOT, ignore_errors=True)


def world_reachable(name: str) -> Path:
    """A folder uid 1000 can reach (/root and pytest's tmp are 0700)."""
    top = CHRUN_ROOT / name
    top.mkdir(parents=True)
    top.parent.chmod(0o755)
    return top


def pulled_into_storage(registry, ref: str, name: str, *flags: str) -> str:
    """Pulls REF under the signature policy into podman's storage; returns the local name
    (named like the image tests' builds, so remove_leftovers clears a killed run's)."""
    local = f"localhost/hpc-train/test-image:{name}-{os.getpid()}"
    proc = pull(registry, ref, f"containers-storage:{local}", *flags)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return local


@contextlib.contextmanager
def directory_image(registry, ref: str, name: str, *flags: str):
    """REF (architecture `name`) pulled under the signature policy; its root filesystem
    mounted by buildah and bound where uid 1000 reaches it (ch-run mounts it read-only),
    its ENV in a host file."""
    local = pulled_into_storage(registry, ref, f"pulled-{name}", *flags)
    container = run(["buildah", "from", "--pull-never", "--arch", name, "--name",
                     f"hpc-train-test-pulled-{name}-{os.getpid()}", local]).stdout.strip()
    top = world_reachable(name)
    image = top / "root"
    image.mkdir()
    try:
        run(["mount", "--bind", run(["buildah", "mount", container]).stdout.strip(), image])
        config = json.loads(run(["podman", "image", "inspect", local]).stdout)[0]
        (top / "environment").write_text("\n".join(config["Config"]["Env"]) + "\n")
        yield image, top / "environment"
    finally:
        run(["umount", image], check=False)
        run(["buildah", "rm", container], check=False)
        run(["podman", "rmi", "--force", local], check=False)
        if not os.path.ismount(image):  # never delete through the bind mount
            shutil.rmtree(top, ignore_errors=True)


@pytest.fixture(scope="module")
def amd64_dir(registry, released):
    """The amd64 image, pulled by digest."""
    with directory_image(registry, f"hpc-train@{released[f'{VERSION}-cuda13-a100']}",
                         "amd64") as found:
        yield found


def workspace(tmp: Path) -> Path:
    """The user's working folder on the host, owned by the user (bound at /workspace)."""
    work = world_reachable(tmp.name)
    for folder in (work, work / "home"):
        folder.mkdir(exist_ok=True)
        os.chown(folder, USER_ID, USER_ID)
    return work


def ch_run_argv(image: Path, argv: list[str], work: Path, env_file: str = "",
                home: bool = True) -> list[str]:
    """`apptainer exec IMAGE ARGV` from WORK, as ch-run says it (see the module docstring),
    as uid 1000: read-only image, no entrypoint, the host's environment."""
    return ["setpriv", f"--reuid={USER_ID}", f"--regid={USER_ID}", "--clear-groups",
            "ch-run", f"--set-env{'=' + env_file if env_file else ''}",
            *(["--home"] if home else []), "-b", f"{work}:/workspace", "-c", "/workspace",
            str(image), "--", *argv]


def ch_run(image: Path, argv: list[str], work: Path, env_file: str = ""):
    env = dict(os.environ, USER="user", HOME=str(work / "home"))
    return subprocess.run(ch_run_argv(image, argv, work, env_file), env=env, text=True,
                          capture_output=True, timeout=600)


def test_amd64_image_trains_evaluates_predicts_and_checks_unprivileged_read_only(
        amd64_dir, tmp_path):
    image, env_file = amd64_dir
    work = workspace(tmp_path)
    trained = ch_run(image, [*DIGITS, "--output-dir", "run"], work, str(env_file))
    assert trained.returncode == 0, trained.stderr[-3000:]
    summary = json.loads((work / "run" / "summary.json").read_text())
    assert summary["steps_run"] == 6 and 0 <= summary["final_accuracy"] <= 1
    assert (work / "run" / "summary.json").stat().st_uid == USER_ID
    evaluated = ch_run(image, ["evaluate", "run", "--json", "e.json"], work, str(env_file))
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    assert json.loads((work / "e.json").read_text())["accuracy"] == summary["final_accuracy"]
    write_digit_pngs(work / "pngs")
    predicted = ch_run(image, ["predict", "run", "pngs", "--top-k", "2"], work, str(env_file))
    assert predicted.returncode == 0, predicted.stderr[-3000:]
    assert len([json.loads(line) for line in predicted.stdout.splitlines()]) == 3
    checked = ch_run(image, ["doctor", "--device", "cpu", *DOCTOR_FAST, "--json", "d.json"],
                     work, str(env_file))
    assert checked.returncode == 0, checked.stdout[-2000:] + checked.stderr[-2000:]
    written = ch_run(image, ["touch", "/opt/hpc-train/written"], work, str(env_file))
    assert written.returncode != 0 and "Read-only file system" in written.stderr


def write_digit_pngs(folder: Path) -> None:
    from PIL import Image

    from workload.data.datasets import load_digits

    folder.mkdir()
    for i, digit in enumerate(load_digits(16).test.images[:3]):
        Image.fromarray(digit.permute(1, 2, 0).numpy()).save(folder / f"{i}.png")


def test_own_script_with_setup_runs_in_the_image(amd64_dir, tmp_path):
    image, env_file = amd64_dir
    work = workspace(tmp_path)
    (work / "own.py").write_text(OWN_SCRIPT)
    proc = ch_run(image, ["python", "own.py"], work, str(env_file))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "rank 0 of 1 on cpu: sum 0" in proc.stdout


@pytest.mark.slurm
def test_two_nodes_four_tasks_train_under_srun_ch_run(amd64_dir, slurm_cluster, tmp_path):
    """The README's `srun ... apptainer exec IMAGE train` per-task form, ch-run in its place."""
    image, env_file = amd64_dir
    work = workspace(tmp_path)
    train = [*DIGITS, "--max-steps", "2", "--output-dir", "run"]
    proc = subprocess.run(
        ["srun", "-N2", "--ntasks-per-node=2", "--kill-on-bad-exit=1",
         *ch_run_argv(image, train, work, str(env_file), home=False)],
        env=dict(slurm_cluster.env, USER="user"), text=True, capture_output=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((work / "run" / "summary.json").read_text())
    assert summary["world_size"] == 4 and summary["steps_run"] == 2


def test_arm64_image_pulled_by_platform_from_x86_runs_under_ch_run(registry, released):
    """`apptainer pull --arch arm64` on an x86_64 login node: the index's arm64 entry runs
    emulated (QEMU binfmt), unprivileged and read-only."""
    with directory_image(registry, f"hpc-train:{VERSION}", "arm64",
                         "--override-arch", "arm64") as (image, env_file):
        python = image / "usr/bin" / os.readlink(image / "usr/bin/python3")
        header = python.read_bytes()[:20]
        assert header[:4] == b"\x7fELF" and int.from_bytes(header[18:20], "little") == 183, \
            "not an aarch64 ELF (e_machine 183)"
        work = workspace(Path("arm64-work"))
        proc = ch_run(image, [*EMULATED, "--output-dir", "run"], work,
                      str(env_file))
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert json.loads((work / "run" / "summary.json").read_text())["steps_run"] == 3
