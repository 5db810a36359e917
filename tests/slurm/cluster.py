"""A private SLURM cluster on this machine: munged, slurmctld and three slurmd "nodes".

Everything lives in one temporary directory (config, keys, sockets, state, logs) and
uses ports picked free at start, so several clusters (one per helper, per CI run) can
run side by side on one machine. Clients reach it through ``SLURM_CONF``:

    with SlurmCluster.start(tmp_path) as cluster:
        cluster.run(["srun", "-N2", "-n4", "hostname"])

Node names follow ../../MACHINE.md: nid001 and nid002, both 127.0.0.1, and the spare
nid003, in the `spares` partition only (the restart tests' third node).
Partitions: `debug` (the default, both nodes, never preempted), and `low` and `high` on
nid001 for the preemption tests (SLURM's preempt/partition_prio with PreemptMode=REQUEUE
and a GraceTime, as sites configure it).

Each node has GPUS_PER_NODE stand-in GPUs of model GPU_MODEL (SLURM's typed GRES over
empty device files, ../../MACHINE.md): jobs schedule by them and SLURM refuses a model
the nodes have not, as a centre's does. A centre's submission rules (a site twin's) are
enforced by SLURM's own job_submit plugin, job_submit.lua beside slurm.conf, as centres
enforce them: `set_submit_rules` turns them on for one test. `add_partitions` gives a
test a centre's partitions with their limits, one of them the default (SLURM refuses a
job over one at submission: EnforcePartLimits=ALL); a centre's partition named as one of
the cluster's own (CSCS's `debug` and `low`) is that partition, changed for the test;
`reset_centre` takes all of it away.
With accounting=True (the session's cluster) slurmdbd keeps SLURM's accounting in a
private MariaDB and SLURM enforces it (associations, limits, QOS): every job runs in the
suite's account and QOS (SUITE_ACCOUNT, SUITE_QOS) but a twin's, which
`set_centre_accounting` gives its centre's account, QOS, their limits and default; root
and the twins' normal user (tests/helpers/users.py) have the same associations.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.helpers import DRAW, free_ports
from tests.helpers.users import USER_NAME, ensure_user, reachable

NODES = ("nid001", "nid002")
# A third node, the spare of the restart tests (tests/e2e/test_restarts_slurm.py): in the
# `spares` partition with the other two, never in `debug`, so the other tests' jobs keep
# the two nodes they were written for.
SPARE_NODE = "nid003"
HOSTS_FILE = Path("/etc/hosts")
# Generous: slurmctld needs a few seconds to register nodes on a loaded 2-core machine.
START_TIMEOUT_S = 60.0
LAUNCH_PREFIXES = ("SLURM_", "SLURMD_", "TORCHELASTIC_", "PET_")
# The low partition's preemption grace time (seconds between SIGTERM and the requeue).
GRACE_TIME_S = 10
# The stand-in GPUs: one a CPU (a site twin counts a GPU as one of a node's 2 CPUs), of the
# model the one twin that requires a typed request names (Alliance's Fir: h100).
GPUS_PER_NODE = 2
GPU_MODEL = "h100"
JOB_SUBMIT = Path(__file__).with_name("job_submit.lua")
LAUNCH_NAMES = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "NODE_RANK",
                "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT", "OMP_NUM_THREADS", "LOCAL_GPU"}

CONF_TEMPLATE = """\
ClusterName={cluster}
# Job ids start in a block of this worker's own (first_job_id): MASTER_PORT is derived
# from the job id, and another private cluster on this machine would otherwise hand out
# the same ids (and ports).
FirstJobId={first_job_id}
SlurmctldHost={host}
SlurmctldPort={ctld_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# cred_expire is also how long a requeued job waits before it may start again: 120 s by
# default, and this suite requeues half a dozen jobs. Step launches here take a second.
AuthInfo=socket={munge_socket},cred_expire=15
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
StateSaveLocation={root}/state
SlurmctldPidFile={root}/ctld.pid
SlurmctldLogFile={root}/ctld.log
SlurmdPidFile={root}/d-%n.pid
SlurmdLogFile={root}/d-%n.log
SlurmdSpoolDir={spool}/spool-%n
ReturnToService=2
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
# Fast turnaround for tests: requeue and cancel without long waits.
KillWait=5
# The main scheduling loop every 2 s, not 60: a requeued job (eligible again once
# cred_expire passed) and a job whose dependency was met wait for that loop; a requeue
# took 25 s to restart at the default, 17 s at 2 (on the 2-core machine).
SchedulerParameters=sched_interval=2
# How long slurmctld keeps an ended job (its state, its StdOut) for `scontrol show job`:
# a test that reads a job's end after a later job of its own (a site page's continue step)
# may come to it minutes after it ended under the suite's load; at 60 s the job was gone
# and the wait for its end ran into its timeout. Squeue lists only live jobs either way.
MinJobAge=3600
InactiveLimit=0
# A job over its partition's time limit is refused at submission, not left pending.
EnforcePartLimits=ALL
# Preemption as sites configure it (the partitions' PriorityTier decides; a preempted job is
# requeued), used by the `low` and `high` partitions only: `debug` jobs are never preempted.
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
GresTypes=gpu
# The centre's submission rules of a twin's test (job_submit.lua beside this file).
JobSubmitPlugins=lua
{accounting_lines}
{node_lines}
{partition_lines}
"""
# `debug`, the default, on both nodes. A job on `low` that a `high` job needs is sent
# SIGTERM, given GraceTime seconds to save, then requeued by SLURM (GRACE_TIME_S: short, so
# that the preemption tests stay fast).
PARTITIONS = (
    "PartitionName=debug Nodes={nodes} Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES "
    "PreemptMode=OFF",
    "PartitionName=low Nodes={first} MaxTime=INFINITE State=UP PriorityTier=1 "
    "PreemptMode=REQUEUE GraceTime={grace}",
    "PartitionName=high Nodes={first} MaxTime=INFINITE State=UP PriorityTier=2 PreemptMode=OFF",
    "PartitionName=spares Nodes={nodes},{spare} MaxTime=INFINITE State=UP OverSubscribe=YES "
    "PreemptMode=OFF",
)

# What a centre's partition sets that a line above may leave out: SLURM's defaults (a
# changed own partition gets them back before its line).
SLURM_DEFAULTS = ("Default=NO", "OverSubscribe=NO", "MaxNodes=UNLIMITED", "QOS=")


# SLURM accounting (a cluster started with accounting=True): slurmdbd over a private
# MariaDB, and SLURM refusing a job outside its user's associations (account), over its
# QOS's limits, or in a QOS the association does not allow, at submission (DenyOnLimit on
# each QOS), as a centre's SLURM does.
ACCOUNTING_LINES = """\
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost={host}
AccountingStoragePort={dbd_port}
# The cluster's munge socket for slurmdbd too (AuthInfo's is for slurmctld's clients only).
AccountingStoragePass={munge_socket}
AccountingStorageEnforce=associations,limits,qos
"""
# slurmdbd.conf: slurmdbd takes no -f and reads it from $SLURM_CONF's folder; it must be
# mode 600. MariaDB over TCP on 127.0.0.1 (StorageHost "localhost" would mean the one
# default socket path of the machine, which clusters side by side cannot share).
DBD_CONF = """\
DbdHost={host}
DbdAddr=127.0.0.1
DbdPort={dbd_port}
SlurmUser=root
AuthType=auth/munge
AuthInfo=socket={munge_socket}
PidFile={root}/dbd.pid
LogFile={root}/dbd.log
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort={db_port}
StorageUser=slurm
StoragePass={password}
StorageLoc=slurm_acct_db
"""
# The suite's own account and QOS: every user's default (root submits the suite's jobs,
# the twins' normal user a site page's: tests/helpers/users.py).
SUITE_ACCOUNT = "hpctrain"
SUITE_QOS = "normal"
ACCOUNT_USERS = ",".join(("root", USER_NAME))
# MariaDB at its smallest (its default 128 MiB buffer pool and 96 MiB redo log, for one
# cluster's few jobs), and without syncing to disk (a test's database, gone with it).
# Each instance also gets a --tmpdir of its own: with the shared /tmp, concurrent
# bootstraps of xdist workers' clusters collide on their temporary tables' names
# ("Could not remove temporary table '/tmp/#sql-temptable-...'", then "Unknown table
# 'mysql.tmp_user_sys'"): 7 of 48 installs failed, four at a time, on the 2-core machine.
MARIADB_SMALL = ("--innodb-buffer-pool-size=16M", "--innodb-log-file-size=4M",
                 "--innodb-doublewrite=0", "--innodb-flush-method=nosync",
                 "--innodb-flush-log-at-trx-commit=0")


def first_job_id() -> int:
    """Job ids in a block of 200 residues mod 1000 of this xdist worker's own (MASTER_PORT
    is derived from the job id mod 1000): clusters of concurrent workers never hand out
    ports that collide, if each submits fewer than 200 jobs."""
    worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)
    return DRAW.randrange(1, 900) * 1000 + 200 * (worker % 5)


def ensure_hosts_entries(names: tuple[str, ...], hosts_file: Path = HOSTS_FILE) -> None:
    """Make the node names resolve (torch's rendezvous looks MASTER_ADDR up)."""
    known = set()
    for line in hosts_file.read_text().splitlines():
        known.update(line.split("#", 1)[0].split()[1:])
    missing = [name for name in names if name not in known]
    if missing:
        with hosts_file.open("a") as handle:
            handle.write(f"127.0.0.1 {' '.join(missing)}  # hpc-train tests/slurm\n")


@dataclass
class SlurmCluster:
    """A running private cluster; ``env`` is what clients need (SLURM_CONF, PATH)."""

    root: Path
    conf: Path
    munge_socket: Path
    # slurmstepd makes a Unix socket per step in the spool folder, and a socket's path has
    # at most 107 bytes: under a test's folder (xdist adds popen-gwN/) a step of a second
    # cluster failed at launch ("Unspecified error"). The spool lives in a short /tmp path,
    # reachable by every user as a node's is: a job's script in it runs as the job's user.
    spool: Path = field(default_factory=lambda: reachable(tempfile.mkdtemp(prefix="slurm-")))
    nodes: tuple[str, ...] = NODES
    spare: str = SPARE_NODE
    _pid_files: list[Path] = field(default_factory=list)
    _added_partitions: list[str] = field(default_factory=list)
    _changed_partitions: list[str] = field(default_factory=list)  # own ones a centre's
    _partition_qos: dict[str, str] = field(default_factory=dict)  # made: name, limits
    accounting: bool = False
    _centre_accounting: list[tuple] = field(default_factory=list)
    _centre_default: bool = False

    @property
    def every_node(self) -> tuple[str, ...]:
        """The nodes with the spare: each one a slurmd of this cluster."""
        return (*self.nodes, self.spare)

    @property
    def env(self) -> dict[str, str]:
        """This process's environment for the clients, minus any launch variables.

        Variables like RANK or SLURM_JOB_ID in the calling process (a CI runner inside a
        SLURM job, or an earlier test) would reach every task and override SLURM's own.
        """
        env = {key: value for key, value in os.environ.items()
               if not key.startswith(LAUNCH_PREFIXES) and key not in LAUNCH_NAMES}
        env["SLURM_CONF"] = str(self.conf)
        return env

    def run(self, args: list[str], timeout: float = 300, **kwargs) -> subprocess.CompletedProcess:
        """Run a client command against this cluster, capturing text output."""
        kwargs.setdefault("env", self.env)
        return subprocess.run(args, capture_output=True, text=True, timeout=timeout, **kwargs)

    # ----------------------------------------------------------------- lifecycle
    @classmethod
    def start(cls, root: Path, accounting: bool = False) -> SlurmCluster:
        """accounting: with slurmdbd over a private MariaDB (ACCOUNTING_LINES), as the
        session's cluster starts; 4 to 9 s more to start on the 2-core machine, mostly
        mariadb-install-db (docs/development.md, "SLURM accounting")."""
        root.mkdir(parents=True, exist_ok=True)
        ensure_hosts_entries((*NODES, SPARE_NODE))
        cluster = cls(root=root, conf=root / "slurm.conf", munge_socket=root / "munge.sock",
                      accounting=accounting)
        try:
            cluster._start_munge()
            cluster._write_conf()
            if accounting:
                cluster._start_accounting()
            cluster._start_slurm()
            cluster._wait_for_nodes()
        except BaseException:
            cluster.stop()
            raise
        return cluster

    def _start_munge(self) -> None:
        key = self.root / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        pid_file = self.root / "munged.pid"
        self._pid_files.append(pid_file)
        subprocess.run(
            ["munged", "--force", f"--socket={self.munge_socket}", f"--key-file={key}",
             f"--pid-file={pid_file}", f"--log-file={self.root / 'munged.log'}",
             f"--seed-file={self.root / 'munged.seed'}"],
            check=True, capture_output=True, text=True, timeout=30)

    def _write_conf(self) -> None:
        ctld_port, self._dbd_port, self._db_port, *node_ports = free_ports(
            3 + len(self.every_node))
        host = socket.gethostname().split(".")[0]
        node_lines = "\n".join(
            f"NodeName={name} NodeHostname={host} NodeAddr=127.0.0.1 Port={port} "
            f"CPUs=2 RealMemory=10000 Gres=gpu:{GPU_MODEL}:{GPUS_PER_NODE} State=UNKNOWN"
            for name, port in zip(self.every_node, node_ports))
        self.conf.write_text(CONF_TEMPLATE.format(
            cluster=f"hpctrain{ctld_port}", first_job_id=first_job_id(),
            host=host, ctld_port=ctld_port,
            munge_socket=self.munge_socket, root=self.root, spool=self.spool,
            node_lines=node_lines,
            accounting_lines=ACCOUNTING_LINES.format(host=host, dbd_port=self._dbd_port,
                                                    munge_socket=self.munge_socket)
            if self.accounting else "",
            partition_lines="\n".join(self.own_partitions().values())))
        (self.root / "state").mkdir(exist_ok=True)
        self._write_gres()
        self._write_job_submit()

    def _write_gres(self) -> None:
        """gres.conf: each node's stand-in GPUs, empty files (slurmd needs a File= to count
        them; AutoDetect off, as there is no NVML)."""
        devices = self.root / "gpus"
        devices.mkdir(exist_ok=True)
        for index in range(GPUS_PER_NODE):
            (devices / f"nvidia{index}").touch()
        last = GPUS_PER_NODE - 1
        (self.root / "gres.conf").write_text("AutoDetect=off\n" + "".join(
            f"NodeName={name} Name=gpu Type={GPU_MODEL} File={devices}/nvidia[0-{last}]\n"
            for name in self.every_node))

    def _write_job_submit(self) -> None:
        """job_submit.lua beside slurm.conf (where slurmctld looks for it), reading the
        rules from this cluster's `submit_rules` file."""
        (self.root / "job_submit.lua").write_text(
            f'local RULES = "{self.submit_rules}"\n' + JOB_SUBMIT.read_text())

    def own_partitions(self) -> dict[str, str]:
        """The cluster's own partitions (PARTITIONS), each name's slurm.conf line."""
        lines = "\n".join(PARTITIONS).format(nodes=",".join(self.nodes), first=self.nodes[0],
                                             grace=GRACE_TIME_S, spare=self.spare)
        return {line.split()[0].removeprefix("PartitionName="): line
                for line in lines.splitlines()}

    def add_partitions(self, limits: dict[str, dict[str, str]], default: str,
                       qos: dict[str, str] | None = None) -> None:
        """A centre's partitions on both nodes, each with its limits as slurm.conf names
        them ({"MaxTime": "12:00:00", "MaxNodes": "4"}; no MaxTime: none), `default` the
        default one, and `qos` a partition's QOS limits (sacctmgr's, see partition_qos),
        until reset_centre (tried again here first, should an earlier reset have failed on
        a job that outlived its cancel). A name of the cluster's own partitions (CSCS's
        `debug`, `low`) is that partition, given the centre's nodes and limits for the test:
        two partitions cannot share a name."""
        self.reset_centre()
        own = self.own_partitions()
        for name, partition_limits in limits.items():
            settings = [f"PartitionName={name}", f"Nodes={','.join(self.nodes)}", "State=UP",
                        "OverSubscribe=YES", "PreemptMode=OFF",
                        f"Default={'YES' if name == default else 'NO'}",
                        *(f"{key}={value}" for key, value in
                          ({"MaxTime": "INFINITE"} | partition_limits).items())]
            if name in (qos or {}):
                settings.append(f"QOS={self.partition_qos(name, qos[name])}")
            if name in own:
                self._changed_partitions.append(name)  # first: a failure below is undone
                self._scontrol("update", *settings)
            else:
                self._scontrol("create", *settings)
                self._added_partitions.append(name)

    def partition_qos(self, partition: str, limits: str) -> str:
        """The QOS of a centre's partition (CSCS's `debug`: "MaxTRESMinsPerJob=node=90
        MaxJobsPerUser=1"), refusing a job over a limit at submission (DenyOnLimit), as a
        partition's QOS applies to every job in it whatever the job's own QOS. Made once
        and kept in SLURM's accounting (a partition names it for a twin's test only)."""
        assert self.accounting, "a partition's QOS needs the cluster's accounting"
        name = f"{partition}-partition"
        if self._partition_qos.get(name) != limits:
            self.sacctmgr(f"modify qos {name} set {limits}" if name in self._partition_qos
                          else f"add qos {name} {limits} Flags=DenyOnLimit")
            self._partition_qos[name] = limits
        return name

    def reset_centre(self) -> None:
        """The cluster as it started: no centre's partitions or submission rules, its own
        partitions as slurm.conf gives them, `debug` the default partition."""
        default_taken = bool(self._added_partitions or self._changed_partitions)
        while self._added_partitions:  # a name leaves the list once SLURM deleted it
            self._scontrol("delete", f"PartitionName={self._added_partitions[-1]}")
            self._added_partitions.pop()
        own = self.own_partitions()
        while self._changed_partitions:
            name, *line = own[self._changed_partitions[-1]].split()
            self._scontrol("update", name, *SLURM_DEFAULTS, *line)  # the line's own win
            self._changed_partitions.pop()
        if default_taken:
            self._scontrol("update", "PartitionName=debug", "Default=YES")
        if self._centre_default:
            self.sacctmgr(f"modify user {ACCOUNT_USERS} set DefaultAccount={SUITE_ACCOUNT}")
            self._centre_default = False
        self.set_submit_rules({})

    def _scontrol(self, *args: str) -> None:
        done = self.run(["scontrol", *args], timeout=30)
        if done.returncode != 0:
            raise RuntimeError(f"scontrol {' '.join(args)}: {done.stderr.strip()}")

    @property
    def submit_rules(self) -> Path:
        return self.root / "centre-rules"

    def set_submit_rules(self, rules: dict[str, str]) -> None:
        """The centre's rules job_submit.lua enforces from the next submission on (NAME=VALUE
        lines; job_submit.lua lists the names); {} for none."""
        text = "".join(f"{name}={value}\n" for name, value in rules.items())
        if text:
            self.submit_rules.write_text(text)
        else:
            self.submit_rules.unlink(missing_ok=True)

    # ----------------------------------------------------------------- accounting
    @property
    def name(self) -> str:
        return re.search(r"^ClusterName=(\S+)", self.conf.read_text(), re.M).group(1)

    def _start_accounting(self) -> None:
        """A private MariaDB (its own data folder, TCP on 127.0.0.1 only), slurmdbd over
        it, and the suite's cluster, account and user registered before slurmctld
        starts (slurmctld asks slurmdbd for its associations as it starts)."""
        data, password = self.root / "mariadb", os.urandom(12).hex()
        private_tmp = self.root / "mariadb-tmp"
        private_tmp.mkdir(mode=0o700)
        options = (*MARIADB_SMALL, f"--tmpdir={private_tmp}")
        subprocess.run(["mariadb-install-db", "--no-defaults", "--user=root",
                        f"--datadir={data}", "--auth-root-authentication-method=normal",
                        "--skip-test-db", *options],
                       check=True, capture_output=True, text=True, timeout=120)
        socket_path = self.root / "mariadb.sock"
        self._pid_files.append(self.root / "mariadb.pid")
        # In the background of a shell that exits at once: mariadbd does not fork itself,
        # and as a child of this process it would stay a zombie once stopped (alive to
        # the pid file's check in _terminate until its timeout).
        subprocess.run(
            ["bash", "-c", '"$@" </dev/null >/dev/null 2>&1 &', "mariadbd",
             "mariadbd", "--no-defaults", "--user=root", f"--datadir={data}",
             f"--socket={socket_path}", f"--port={self._db_port}", "--bind-address=127.0.0.1",
             f"--pid-file={self.root / 'mariadb.pid'}", f"--log-error={self.root / 'mariadb.log'}",
             "--skip-name-resolve", "--performance-schema=OFF", *options],
            check=True, timeout=30)
        _wait_for(lambda: socket_path.is_socket() and (self.root / "mariadb.pid").exists(),
                  f"MariaDB did not start; its log: {self.root / 'mariadb.log'}")
        subprocess.run(
            ["mariadb", "--no-defaults", f"--socket={socket_path}", "-u", "root", "-e",
             "CREATE DATABASE slurm_acct_db; "
             f"CREATE USER 'slurm'@'127.0.0.1' IDENTIFIED BY '{password}'; "
             "GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';"],
            check=True, capture_output=True, text=True, timeout=60)
        dbd_conf = self.root / "slurmdbd.conf"
        dbd_conf.touch(mode=0o600)
        dbd_conf.write_text(DBD_CONF.format(
            host=socket.gethostname().split(".")[0], dbd_port=self._dbd_port,
            munge_socket=self.munge_socket, root=self.root, db_port=self._db_port,
            password=password))
        self._pid_files.append(self.root / "dbd.pid")
        self._daemon(["slurmdbd"])
        _wait_for(lambda: self.run(["sacctmgr", "-n", "show", "qos"], timeout=30
                                   ).returncode == 0,
                  f"slurmdbd does not answer; its log: {self.root / 'dbd.log'}")
        ensure_user()  # (SLURM finds a user's associations by its passwd entry)
        self.sacctmgr(f"add cluster {self.name}", f"add account {SUITE_ACCOUNT}",
                      f"add user {ACCOUNT_USERS} Account={SUITE_ACCOUNT} "
                      f"DefaultAccount={SUITE_ACCOUNT}")

    def sacctmgr(self, *commands: str) -> None:
        """sacctmgr's commands, in order, without its questions (-i)."""
        for command in commands:
            done = self.run(["sacctmgr", "-i", *command.split()], timeout=60)
            if done.returncode != 0:
                raise RuntimeError(f"sacctmgr {command}: {done.stderr.strip() or done.stdout}")

    def set_centre_accounting(self, account: str, qos: dict[str, str], default_qos: str | None
                              ) -> None:
        """A centre's account, the user's default as for a user of one project, and its
        QOS with their limits (sacctmgr's, "MaxWall=00:30:00 MaxTRESPerJob=gres/gpu=4";
        "" for none), the account's jobs in those only, `default_qos` theirs when they
        name none. Each QOS refuses a job over a limit at submission (DenyOnLimit), as a
        centre's `sbatch` does. reset_centre makes the suite's account the default again;
        the centre's account and QOS stay until another centre's replace them (no job of
        the suite names them), so that a twin's next test reuses them: each sacctmgr
        command takes about half a second here."""
        assert SUITE_QOS not in qos, f"a centre's QOS may not be the suite's {SUITE_QOS}"
        centre = (account, tuple(qos.items()), default_qos)
        if self._centre_accounting != [centre]:
            self._drop_centre_accounting()
            self._centre_accounting.append(centre)  # first: a failure below is undone
            for name, limits in qos.items():
                self.sacctmgr(f"add qos {name} {limits} Flags=DenyOnLimit")
            self.sacctmgr(f"add account {account}",
                          f"add user {ACCOUNT_USERS} Account={account} "
                          f"QOS={','.join(qos) or SUITE_QOS}"
                          + (f" DefaultQOS={default_qos}" if default_qos else ""))
        self.sacctmgr(f"modify user {ACCOUNT_USERS} set DefaultAccount={account}")
        self._centre_default = True

    def _drop_centre_accounting(self) -> None:
        """The last centre's account and QOS gone from SLURM's accounting."""
        for account, qos, _ in self._centre_accounting:
            self.sacctmgr(f"modify user {ACCOUNT_USERS} set DefaultAccount={SUITE_ACCOUNT}",
                          f"delete user {ACCOUNT_USERS} Account={account}",
                          f"delete account {account}",
                          *(f"delete qos {name}" for name, _ in qos))
        self._centre_accounting.clear()

    def _start_slurm(self) -> None:
        self._pid_files.append(self.root / "ctld.pid")
        self._daemon(["slurmctld", "-f", str(self.conf)])
        for name in self.every_node:
            self._pid_files.append(self.root / f"d-{name}.pid")
            self.start_node(name)

    def start_node(self, name: str) -> None:
        """Start the node's slurmd (again, after stop_node)."""
        self._daemon(["slurmd", "-f", str(self.conf), "-N", name])

    def back_in_service(self, name: str, timeout_s: float = START_TIMEOUT_S) -> None:
        """Wait until the node (its slurmd running) is in service again: a drained one
        is resumed; a DOWN one comes back as its slurmd registers (ReturnToService=2),
        and RESUME is refused once it has."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.run(["scontrol", "update", f"NodeName={name}", "State=RESUME"], timeout=30)
            states = self.run(["sinfo", "-h", "-N", "-n", name, "-o", "%t"], timeout=30)
            if states.stdout.split()[:1] in (["idle"], ["mix"], ["alloc"]):
                return
            time.sleep(0.5)
        raise RuntimeError(f"node {name} not back in service after {timeout_s:.0f}s; logs "
                           f"in {self.root}")

    def stop_node(self, name: str) -> None:
        """Stop the node's slurmd, as a node lost stops answering (its jobs' processes
        are the caller's to end)."""
        _terminate([self.root / f"d-{name}.pid"])

    def _daemon(self, args: list[str]) -> None:
        """Start a daemon that forks into the background; fail loudly if it cannot."""
        done = subprocess.run(args, capture_output=True, text=True, timeout=60,
                              env=self.env)
        if done.returncode != 0:
            raise RuntimeError(f"{args[0]} failed to start: {done.stderr.strip()}\n"
                               f"logs in {self.root}")

    def _wait_for_nodes(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            done = self.run(["sinfo", "-h", "-N", "-o", "%N %t"], timeout=30)
            states = dict(line.split() for line in done.stdout.splitlines() if line.strip())
            if done.returncode == 0 and all(states.get(n) == "idle" for n in self.every_node):
                return
            time.sleep(0.5)
        raise RuntimeError(f"SLURM nodes not idle after {START_TIMEOUT_S:.0f}s: "
                           f"{done.stdout.strip() or done.stderr.strip()}; logs in {self.root}")

    def stop(self) -> None:
        """Cancel the jobs still here, then stop exactly the daemons this cluster started,
        by their pid files. A job that a failed test left running would outlive the
        daemons (its slurmstepd and tasks stay, holding their ports) and fail the tests of
        a later cluster in turn."""
        self.cancel_jobs()
        _terminate(self._pid_files)
        shutil.rmtree(self.spool, ignore_errors=True)

    def cancel_jobs(self, timeout_s: float = 30.0) -> None:
        """scancel every job in the queue until it is empty (SLURM sends the steps SIGTERM,
        then SIGKILL KillWait later) or `timeout_s` passed; nothing where the controller
        does not answer (a cluster that failed to start)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                queue = self.run(["squeue", "--noheader", "--format=%i"], timeout=10)
                if queue.returncode != 0 or not queue.stdout.split():
                    return
                self.run(["scancel", *queue.stdout.split()], timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                return
            time.sleep(0.5)

    def __enter__(self) -> SlurmCluster:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def _terminate(pid_files: list[Path], timeout_s: float = 15.0) -> None:
    """SIGTERM to each daemon at once, then SIGKILL to those alive after timeout_s: each
    takes about 2 s to stop, 14 s one after another for a cluster with accounting (the
    last teardown of each SLURM worker, at the suite's end). Nothing of the cluster is
    kept, so slurmctld need not reach slurmdbd on its way out."""
    pids = []
    for pid_file in pid_files:
        try:
            pid = int(pid_file.read_text().split()[0])
            os.kill(pid, signal.SIGTERM)
        except (OSError, ValueError, IndexError):  # no pid file, or the daemon is gone
            continue
        pids.append(pid)
    deadline = time.monotonic() + timeout_s
    while pids and time.monotonic() < deadline:
        pids = [pid for pid in pids if _alive(pid)]
        time.sleep(0.1)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _wait_for(ready, failure: str, timeout_s: float = START_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not ready():
        if time.monotonic() > deadline:
            raise RuntimeError(failure)
        time.sleep(0.2)


def tools_present() -> bool:
    return all(shutil.which(tool) for tool in ("munged", "slurmctld", "slurmd", "srun",
                                               "slurmdbd", "sacctmgr", "mariadbd"))
