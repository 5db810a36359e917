"""doctor's storage checks, one function at a time: the file system under a folder read
from a mounts table, and a compile cache on a shared file system named with its fix.
tests/e2e/test_doctor.py runs the doctor on a noexec temp folder and a read-only home."""

from workload.doctor.findings import OK, WARN
from workload.caches import file_system_type
from workload.doctor.storage import compile_cache_check

MOUNTS = """/dev/sda1 / ext4 rw,relatime 0 0
srv:/export {top} nfs4 rw,relatime 0 0
tmpfs {top}/local tmpfs rw,nosuid 0 0
lustre@o2ib:/fs {top}/with\\040space lustre rw 0 0
"""


def test_the_longest_mount_point_holding_the_folder_gives_its_type(tmp_path):
    mounts = MOUNTS.format(top=tmp_path)
    (tmp_path / "local").mkdir()
    (tmp_path / "with space").mkdir()
    assert file_system_type(tmp_path / "triton", mounts) == "nfs4"  # not there yet: parent
    assert file_system_type(tmp_path / "local" / "inductor", mounts) == "tmpfs"
    assert file_system_type(tmp_path / "with space" / "x", mounts) == "lustre"
    assert file_system_type(tmp_path / "localx", mounts) == "nfs4", "a prefix of a name"
    assert file_system_type("/", mounts) == "ext4"


def test_a_compile_cache_on_a_shared_file_system_warns_naming_the_variable(tmp_path,
                                                                          monkeypatch):
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    finding = compile_cache_check("TRITON_CACHE_DIR", MOUNTS.format(top=tmp_path))
    assert finding.status == WARN and "nfs4, a shared file system" in finding.detail
    assert finding.fix.startswith("export TRITON_CACHE_DIR=") and "unset it" in finding.fix


def test_a_compile_cache_on_a_local_disk_is_fine(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    mounts = f"/dev/sda1 / ext4 rw 0 0\n/dev/nvme0n1 {tmp_path} xfs rw 0 0\n"
    finding = compile_cache_check("TORCHINDUCTOR_CACHE_DIR", mounts)
    assert finding.status == OK and "node-local (xfs)" in finding.detail
