"""doctor's MPI plugin check from the variables srun exports (the real plugin under SLURM:
tests/e2e/test_slurm_launch.py)."""

from __future__ import annotations

import os

from workload.doctor.mpi import mpi_check

PMIX = {"SLURM_MPI_TYPE": "pmix", "PMIX_SERVER_URI41": "pmix-server.1;tcp4://127.0.0.1:1",
        "PMIX_RANK": "0"}


def test_outside_a_step_or_without_a_plugin_nothing_to_warn():
    assert mpi_check({}) is None
    assert mpi_check({"SLURM_MPI_TYPE": "none"}).status == "ok"


def test_pmix_without_its_server_variables_warns():
    found = mpi_check({"SLURM_MPI_TYPE": "pmix_v4"})
    assert found.status == "warn" and "no PMIX_SERVER_URI" in found.detail
    assert "--mpi=none" in found.fix


def test_pmix_server_folder_missing_here_names_the_spool_to_bind(tmp_path):
    found = mpi_check(PMIX | {"PMIX_SERVER_TMPDIR": str(tmp_path / "spool" / "pmix.7.0")})
    assert found.status == "warn" and "is not visible here" in found.detail
    assert f"--bind {tmp_path / 'spool'}" in found.fix


def test_pmix_server_folder_visible_is_ok(tmp_path):
    assert mpi_check(PMIX | {"PMIX_SERVER_TMPDIR": str(tmp_path)}).status == "ok"


def test_pmi2_descriptor_closed_or_bad_warns_and_open_is_ok(tmp_path):
    with open(tmp_path / "f", "w") as handle:
        assert mpi_check({"SLURM_MPI_TYPE": "pmi2",
                          "PMI_FD": str(handle.fileno())}).status == "ok"
    read, write = os.pipe()
    os.close(read)
    os.close(write)
    for fd in (str(read), "x", ""):
        found = mpi_check({"SLURM_MPI_TYPE": "pmi2", "PMI_FD": fd})
        assert found.status == "warn" and "is not an open file" in found.detail
