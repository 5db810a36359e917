"""Fixtures every test may use. Shared functions and constants live in tests/helpers."""

from __future__ import annotations

import os

# The suite runs more torch processes than the machine has cores (make test: 4 workers on
# 2). OpenMP's threads spin while they wait for work by default, and spinning threads of
# one process take the cores another's need: a tiny training ran 1.5 to 3.6 times slower
# under that load than with PASSIVE (sleeping) waits, enough to pass SLURM tests' limits.
# Set before torch loads OpenMP, here and in every process the tests start.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import shutil  # noqa: E402
import subprocess
import tempfile
from pathlib import Path

import pytest

from tests.helpers import DIGITS_RUN, TINY, run_train, tiers, write_image_folder
from tests.helpers.images import build
from tests.helpers.registry import local_registry
from tests.slurm.fixture import slurm_cluster, slurm_session  # noqa: F401  (see tests/slurm)


@pytest.fixture
def tiny_args() -> list[str]:
    return list(TINY)


@pytest.fixture(scope="session")
def digits_run(tmp_path_factory) -> Path:
    """A finished tiny run on the digits, trained once per session (per worker under
    xdist) for the tests that only read it: model files, evaluate, predict. A test that
    writes into a run copies it first."""
    out = tmp_path_factory.mktemp("digits") / "run"
    run_train(DIGITS_RUN, out)
    return out


@pytest.fixture(scope="session")
def shard_source(tmp_path_factory) -> Path:
    """A few hundred tiny JPEGs as an image folder (3 classes, 40 images each per split),
    written once per session for the shard tests; read only (a test that changes it
    copies it first)."""
    return write_image_folder(tmp_path_factory.mktemp("shards") / "src", classes=3,
                              per_class=40, size=8)


@pytest.fixture(scope="session")
def shard_folder(shard_source, tmp_path_factory) -> Path:
    """`shard_source` written as shards of 25 images (5 train and 5 val shards), in this
    process; read only."""
    from workload.data.shardwrite import write_shards

    dest = tmp_path_factory.mktemp("shards") / "shards"
    write_shards(shard_source, dest, shard_size=25)
    return dest


# The image tests' builds, shared by every module that needs them (building the NGC
# stand-in image or the emulated arm64 one twice would cost minutes).
@pytest.fixture(scope="session")
def image():
    """The Dockerfile built on the NGC stand-in base (amd64)."""
    yield from build("ngc")


@pytest.fixture(scope="session")
def arm64_image():
    """The Dockerfile built for linux/arm64 on the arm64 stand-in, under QEMU emulation."""
    yield from build("arm64", "CUDA_ARCH=9.0", arch="arm64")


@pytest.fixture(scope="session")
def registry(tmp_path_factory):
    """A local OCI registry with cached storage, a signing key and a policy requiring it
    (tests/helpers/registry.py); stopped at the end of the session."""
    with local_registry(tmp_path_factory.mktemp("registry")) as started:
        yield started


# The tiers' guard (tests/helpers/tiers.py): from the first fixture of a test to its last
# teardown, what the test starts must match its markers.
GUARD_REPORTS = Path(tempfile.mkdtemp(prefix="hpc-train-tier-guard-"))
GUARD = pytest.StashKey[tiers.Guard]()


@pytest.hookimpl(tryfirst=True)  # before xdist's loadgroup reads the groups
def pytest_collection_modifyitems(items):
    tiers.group_for_workers(items)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_setup(item):
    if problems := tiers.missing_fixture_markers(item):
        pytest.fail("; ".join(problems), pytrace=False)
    guard = tiers.Guard(tiers.markers_of(item), GUARD_REPORTS / f"{id(item)}.txt")
    item.stash[GUARD] = guard.__enter__()
    return (yield)


@pytest.hookimpl(wrapper=True, trylast=True)
def pytest_runtest_teardown(item, nextitem):
    guard = item.stash.get(GUARD, None)
    # The worker's last teardown also ends the session's fixtures (an image's container, a
    # SLURM cluster), which the heavy tests that requested them set up: not this test's work.
    if nextitem is None and guard is not None:
        guard.__exit__()
    try:
        return (yield)
    finally:
        if guard is not None:
            guard.__exit__()
            if problems := guard.problems():
                pytest.fail("; ".join(dict.fromkeys(problems)), pytrace=False)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """A command run with check=True or a timeout failed: its own words in the report
    (CalledProcessError's message has only the exit status, and they are what tells a
    flaky daemon from a broken test)."""
    report = yield
    error = call.excinfo.value if call.excinfo else None
    if isinstance(error, (subprocess.CalledProcessError, subprocess.TimeoutExpired)):
        program = Path(str(error.cmd[0] if isinstance(error.cmd, list) else error.cmd)).name
        for stream in ("stdout", "stderr"):
            if output := getattr(error, stream):
                text = output.decode(errors="replace") if isinstance(output, bytes) else output
                report.sections.append((f"{stream} of {program}", text[-4000:]))
    return report


def pytest_sessionfinish():
    shutil.rmtree(GUARD_REPORTS, ignore_errors=True)
