"""NCCL transport detection: the INFO log NCCL writes, and the fabric devices sysfs shows.

NCCL needs GPUs, so its log is taken from the lines NCCL 2.x prints (formats below); the
decision is tested against a fake /sys/class tree, as the machine has no fabric.
"""

from __future__ import annotations

import pytest

from workload.doctor import ranks
from workload.launch import nccl_net

PREFIX = "nid001:51234:51290 [0] NCCL INFO "
SOCKET_LOG = [PREFIX + line for line in (
    "Bootstrap : Using hsn0:10.100.0.1<0>",
    "NET/Plugin: Could not find: libnccl-net.so. Using internal network plugin.",
    "NET/Socket : Using [0]hsn0:10.100.0.1<0> [1]hsn1:10.100.0.2<0>",
    "Using network Socket",
    "Channel 00/02 :    0   1   2   3   4   5   6   7",
    "Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read",
    "Channel 00/0 : 3[3] -> 4[0] [send] via NET/Socket/0",
)]
IB_LOG = [PREFIX + line for line in (
    "NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB ; OOB ib0:10.0.0.1<0>",
    "Using network IB",
    "Channel 00/0 : 3[3] -> 4[0] [send] via NET/IB/0/GDRDMA",
    "Channel 01/0 : 0[0] -> 1[1] via SHM/direct/direct",
)]
OFI_LOG = [PREFIX + line for line in (
    "NET/OFI Selected Provider is cxi (found 4 nics)",
    "Using network AWS Libfabric",
    "Channel 00/0 : 3[3] -> 4[0] [send] via NET/AWS Libfabric/0/GDRDMA",
)]


def sys_class(tmp_path, **devices):
    for kind, names in devices.items():
        for name in names:
            (tmp_path / kind / name).mkdir(parents=True)
    return tmp_path


@pytest.mark.parametrize("log, network, transports, provider", [
    (SOCKET_LOG, "Socket", ["NET/Socket", "P2P"], None),
    (IB_LOG, "IB", ["NET/IB", "SHM"], None),
    (OFI_LOG, "AWS Libfabric", ["NET/AWS Libfabric"], "cxi"),
])
def test_nccl_log_names_network_and_channel_transports(log, network, transports, provider):
    assert nccl_net.parse_nccl_log(log) == dict(network=network, transports=transports,
                                             ofi_provider=provider)


@pytest.mark.parametrize("devices, fix_words", [
    ({"infiniband": ["mlx5_0", "mlx5_1"]}, ["NCCL_IB_DISABLE", "/dev/infiniband"]),
    ({"cxi": ["cxi0", "cxi1"]}, ["NCCL_NET='AWS Libfabric'", "FI_PROVIDER=cxi"]),
])
def test_sockets_next_to_a_fabric_warn_with_the_fix(tmp_path, devices, fix_words):
    found = nccl_net.fabric_devices(sys_class(tmp_path, **devices))
    finding = ranks.transport_finding("nccl", nccl_net.parse_nccl_log(SOCKET_LOG), found, 2)
    assert finding.status == "warn" and "fell back to TCP sockets" in finding.detail
    for word in fix_words:
        assert word in finding.fix


@pytest.mark.parametrize("log, devices, nodes", [
    (IB_LOG, {"infiniband": ["mlx5_0"]}, 2),        # the fabric is used
    (OFI_LOG, {"cxi": ["cxi0"]}, 2),
    (SOCKET_LOG, {}, 2),                             # no fabric to fall back from
    ([PREFIX + "Using network Socket", PREFIX + "Channel 00/0 : 0[0] -> 1[1] via P2P/IPC"],
     {"infiniband": ["mlx5_0"]}, 1),                 # one node: data moves over P2P
])
def test_no_warning_when_the_fabric_is_used_or_absent(tmp_path, log, devices, nodes):
    found = nccl_net.fabric_devices(sys_class(tmp_path, **devices))
    finding = ranks.transport_finding("nccl", nccl_net.parse_nccl_log(log), found, nodes)
    assert finding.status == "ok"


def test_gloo_says_tcp_and_one_process_says_no_collective(tmp_path):
    found = nccl_net.fabric_devices(sys_class(tmp_path, cxi=["cxi0"]))
    gloo = ranks.transport_finding("gloo", nccl_net.parse_nccl_log([]), found, 2)
    assert gloo.status == "info" and "TCP" in gloo.detail and "Slingshot (cxi0)" in gloo.detail
    assert ranks.transport_finding(None, {}, {}, 1).status == "info"


def test_nccl_log_goes_to_the_given_file_unless_the_user_chose(tmp_path):
    env = {}
    path = nccl_net.capture_nccl_log(tmp_path / "nccl.log", env)
    assert env["NCCL_DEBUG"] == "INFO" and env["NCCL_DEBUG_FILE"] == str(path)
    assert path == tmp_path / "nccl.log"
    mine = {"NCCL_DEBUG": "WARN"}
    assert nccl_net.capture_nccl_log(tmp_path, mine) is None and mine == {"NCCL_DEBUG": "WARN"}


def nccl_info(backend: str, nodes: int, local_rank: int = 0):
    import torch

    from workload.distributed import DistInfo
    from workload.launch.script import Launch
    launch = Launch(local_rank, local_rank, 4 * nodes, 4, 0, "cuda")
    return DistInfo(launch, torch.device("cpu"), backend)


@pytest.mark.parametrize("log, devices, warned", [
    (SOCKET_LOG, {"cxi": ["cxi0"]}, True),       # TCP next to Slingshot: said
    (OFI_LOG, {"cxi": ["cxi0"]}, False),         # the plugin's network: nothing to say
    (SOCKET_LOG, {}, False),                     # no faster fabric on the node
])
def test_train_says_in_its_log_when_nccl_took_tcp_next_to_a_fabric(tmp_path, caplog, log,
                                                                  devices, warned):
    """Item 8 of issue 60: train's first-step hook runs the doctor's transport check on
    the NCCL log its process wrote, and warns with the doctor's fix, once a node."""
    from workload.training.run import nccl_transport_warning
    nccl_log = tmp_path / "nccl.log"
    nccl_log.write_text("\n".join(log) + "\n")
    fabric = sys_class(tmp_path / "sys", **devices)
    fabric.mkdir(exist_ok=True)
    with caplog.at_level("WARNING", logger="workload"):
        nccl_transport_warning(nccl_info("nccl", 2), nccl_log, fabric)()
        nccl_transport_warning(nccl_info("nccl", 2, local_rank=1), nccl_log, fabric)()
    said = [r.getMessage() for r in caplog.records if "fell back to TCP" in r.getMessage()]
    assert len(said) == (1 if warned else 0), caplog.text
    assert not warned or "FI_PROVIDER=cxi" in said[0], said


def test_train_sends_nccl_info_to_a_private_file_with_no_name_for_one_run(tmp_path,
                                                                         monkeypatch):
    """NCCL opens the log by its path and writes it (as NCCL does, fopen "w"); the run
    reads it back; nothing is ever named in the temporary folder, so a rank that ends
    without unwinding (SLURM's SIGKILL, os._exit) leaves nothing in the node's /tmp."""
    monkeypatch.setattr(nccl_net.tempfile, "tempdir", str(tmp_path))
    env = {}
    with nccl_net.nccl_log_for_one_run(env) as path:
        assert env["NCCL_DEBUG"] == "INFO" and env["NCCL_DEBUG_FILE"] == str(path)
        assert list(tmp_path.iterdir()) == []
        assert oct(path.stat().st_mode & 0o777) == oct(0o600)
        with open(env["NCCL_DEBUG_FILE"], "w") as nccl:
            nccl.write("\n".join(SOCKET_LOG) + "\n")
        assert nccl_net.read_nccl_log(path)["network"] == "Socket"
    assert env == {} and list(tmp_path.iterdir()) == []
    mine = {"NCCL_DEBUG": "WARN"}  # the user's choice of NCCL's log is kept, not read
    with nccl_net.nccl_log_for_one_run(mine) as path:
        assert path is None and mine == {"NCCL_DEBUG": "WARN"}
