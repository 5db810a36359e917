"""The tiers' guard (tests/helpers/tiers.py): a test without a marker cannot start what the
marker declares, in its own process or in a Python process it starts."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.helpers import REPO, tiers
from tests.helpers.tier_guard.sitecustomize import UnmarkedHeavyWork

GLOO_GROUP = ("import torch.distributed as dist; dist.init_process_group('gloo', "
              "init_method='tcp://127.0.0.1:0', rank=0, world_size=1)")


def test_a_program_of_a_marker_is_refused_without_it(tmp_path):
    with tiers.Guard(set(), tmp_path / "report") as guard:
        for program in ("torchrun", "/usr/bin/srun", "podman", "mount"):
            with pytest.raises(UnmarkedHeavyWork, match="marker"):
                subprocess.run([program, "--version"])
    assert [line.split()[0] for line in guard.problems()] == [
        "torchrun", "srun", "podman", "mount"]
    assert "'root' marker" in guard.problems()[-1]


def test_a_process_group_in_a_child_python_is_reported(tmp_path):
    with tiers.Guard(set(), tmp_path / "report") as guard:
        child = subprocess.run([sys.executable, "-c", GLOO_GROUP], capture_output=True,
                               text=True)
    assert child.returncode != 0 and "mark it slow" in child.stderr
    assert len(guard.problems()) == 1 and "a torch process group" in guard.problems()[0]


def test_a_training_in_this_process_is_refused(tmp_path):
    from workload.training.trainer import Trainer

    with tiers.Guard(set(), tmp_path / "report") as guard:
        with pytest.raises(UnmarkedHeavyWork, match="started a training"):
            Trainer.fit(None)
    assert len(guard.problems()) == 1


@pytest.mark.slow  # it starts a process group, as it should
@pytest.mark.parametrize("marker", ["slow", "gpu"])  # the GPU tier never runs in the fast one
def test_the_marker_allows_it(tmp_path, marker):
    with tiers.Guard({marker}, tmp_path / "report") as guard:
        child = subprocess.run([sys.executable, "-c", GLOO_GROUP + "; print('ok')"],
                               capture_output=True, text=True, timeout=120)
    assert child.returncode == 0 and child.stdout.strip() == "ok", child.stderr
    assert guard.problems() == []


def test_the_gpu_tier_may_start_any_program(tmp_path):
    with tiers.Guard({"gpu"}, tmp_path / "report") as guard:
        with pytest.raises(FileNotFoundError):  # past the guard, to the missing program
            subprocess.run([str(tmp_path / "torchrun"), "--version"])
    assert guard.problems() == []


def test_make_check_leaves_out_every_heavy_marker_and_pytest_knows_them(pytestconfig):
    makefile = (REPO / "Makefile").read_text()
    assert f"FAST_TIER := {tiers.FAST_TIER}\n" in makefile
    declared = {line.split(":")[0] for line in pytestconfig.getini("markers")}
    assert set(tiers.HEAVY_MARKERS) <= declared


GROUPED_TESTS = '''
import os
import pytest

@pytest.fixture
def registry():
    pass

@pytest.mark.{marker}
@pytest.mark.parametrize("i", range(4))
def test_{name}(i, {fixture}, request):
    group = request.node.get_closest_marker("xdist_group").args[0]
    with open("workers.txt", "a") as f:
        f.write(f"{name} {{os.environ['PYTEST_XDIST_WORKER']}} {{group}}\\n")
'''


@pytest.mark.slow  # three pytest processes, a few seconds
def test_tests_that_share_an_image_or_a_cluster_run_on_one_worker(tmp_path):
    """The grouping make test relies on, through xdist as it is installed: a pytest or
    xdist release that stops honouring xdist_group (pytest-xdist#1386) fails here. The
    SLURM tests are dealt out one by one over tiers.SLURM_WORKERS groups, each group on
    one worker: every SLURM module has tests in each group."""
    (tmp_path / "conftest.py").write_text(
        "import pytest\nfrom tests.helpers import tiers\n\n"
        "@pytest.hookimpl(tryfirst=True)\n"
        "def pytest_collection_modifyitems(items):\n    tiers.group_for_workers(items)\n")
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    image\n    slurm\n")
    for module, marker, fixture in (("one", "image", "tmp_path"), ("two", "image", "tmp_path"),
                                    ("three", "slurm", "tmp_path"), ("four", "image", "registry"),
                                    ("five", "image", "registry"), ("six", "slurm", "tmp_path")):
        (tmp_path / f"test_{module}.py").write_text(
            GROUPED_TESTS.format(marker=marker, name=module, fixture=fixture))
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "2", "--dist",
                           "loadgroup", "-p", "no:cacheprovider"], cwd=tmp_path, text=True,
                          capture_output=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(
                              filter(None, (str(REPO), os.environ.get("PYTHONPATH"))))})
    assert done.returncode == 0, done.stdout + done.stderr
    ran = [line.split() for line in (tmp_path / "workers.txt").read_text().splitlines()]
    assert len(ran) == 24
    for names in (("one", "two"), ("four", "five")):  # amd64, arm64
        assert len({worker for name, worker, _ in ran if name in names}) == 1, ran
    slurm_groups = {f"slurm-{n}" for n in range(tiers.SLURM_WORKERS)}
    for module in ("three", "six"):
        assert {group for name, _, group in ran if name == module} == slurm_groups, ran
    for group in slurm_groups:
        assert len({worker for _, worker, named in ran if named == group}) == 1, ran


SESSION_FIXTURE_TESTS = '''
import subprocess
import pytest

@pytest.fixture(scope="session")
def mounted():
    yield
    subprocess.run(["mount", "--version"], check=True, capture_output=True)

@pytest.mark.root
def test_heavy(mounted):
    pass

def test_light_and_last():
    pass
'''


@pytest.mark.slow  # a pytest process, a few seconds
def test_a_session_fixture_ends_in_the_last_tests_teardown_unrefused(tmp_path):
    """A worker's last test, unmarked, also tears down the session's fixtures that heavy
    tests set up (an image's container): that cleanup is not the light test's work."""
    (tmp_path / "conftest.py").write_text(
        "from tests.conftest import pytest_runtest_setup, pytest_runtest_teardown  # noqa\n")
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    root\n")
    (tmp_path / "test_order.py").write_text(SESSION_FIXTURE_TESTS)
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"],
                          cwd=tmp_path, text=True, capture_output=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(
                              filter(None, (str(REPO), os.environ.get("PYTHONPATH"))))})
    assert done.returncode == 0 and "2 passed" in done.stdout, done.stdout + done.stderr


@pytest.mark.root  # a mount namespace and overlays; the packages make test installed
def test_without_the_debian_packages_their_files_are_absent_and_the_rest_is_there():
    """.ci/run's second `make check` runs under tools/without_debian_packages.py: there the
    suite's Debian packages must look uninstalled (their programs and files absent, as on
    a newcomer's machine) while the rest of the system stays as it is."""
    probe = ("command -v srun podman; test -e /usr/share/lmod/lmod/init/bash && echo lmod; "
             "command -v python3 mount git")
    outside = subprocess.run(["bash", "-c", probe], capture_output=True, text=True)
    assert {"srun", "podman", "lmod"} <= {os.path.basename(line)
                                         for line in outside.stdout.split()}
    inside = subprocess.run([str(REPO / "tools" / "without_debian_packages.py"), "bash", "-c",
                             probe], capture_output=True, text=True, timeout=120)
    assert inside.returncode == 0, inside.stderr
    assert [os.path.basename(line) for line in inside.stdout.split()] == [
        "python3", "mount", "git"]
    assert "files of" in inside.stderr and "lmod" in inside.stderr
