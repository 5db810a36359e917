"""A centre's twin on the suite's SLURM cluster, and the runner that types a site page's
steps into it (docs/development.md, "Site pages are tests").

A twin is described by tests/twins/<site>.toml (every value cited): the centre's
partitions and account, its compute nodes' shape and architecture against the login
node's, its module names and their prerequisites, its file-system roots and the user's
variables, its container runtime. `Twin.run(page_text)` runs the page's marked steps in
order in one login shell (bash -e: a step that fails stops the rest, as the user would
stop), waits for the jobs they submitted and returns what the user would see. The steps
run as a normal user (tests/helpers/users.py: setpriv, a login's environment), never as
root: the home folder and the folders the centre gives the user and their project are
the user's, everything above them root's; the image is the test environment, which the
user is let through to (tests/helpers/users.py, grant_passage).

What the twin changes on the page's text, and nothing else (the documented
substitutions): the page's project placeholder becomes the twin's project; a path under
a site file system (/cluster/..., /capstor/..., /scratch/...) lives under the twin's root
folder, and a home folder link to one (Alliance's ~/scratch) points there; the
page's `--dataset cifar100` (and the job scripts' default) trains the tiny way of
TINY_TRAIN, still on CIFAR-100 read from the page's --data-dir: its data step's
`--download` fetches a small CIFAR-shaped archive from the twin's stand-in internet
(StandInInternet), so a job reading another folder than the one the data step wrote
fails as it would at the centre; a continue step's <jobid> is the page's first job,
whose training goes on to step 4 (CONTINUED_TRAIN), or, where the run meets a real time
limit (Twin.run(time_limited=True)), past the checkpoint that limit left; the page's
`--time` is then TIME_LIMIT_MINUTES, and a signal its header asks before the limit is
scaled with it (SIGNALLED_LIMIT), the user's cap on requeues after it 0; the user's own
`my_train.py` is OWN_SCRIPT; a GPU is one of the cluster's 2 CPUs a node (torchrun's
--nproc-per-node, the job's tasks). The commands the suite's machine lacks are the stand-ins of
tests/twins/stand_ins (the image is the host's Python environment, its architecture
still checked); `module` is Lmod itself over module files made from the twin's table.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tarfile
import threading
import tomllib
import weakref
from dataclasses import dataclass
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import hostlist

from tests.helpers import REPO, TESTS, wait_for, write_cifar100
from tests.helpers.users import User
from tests.slurm.jobs import (ENDED_STATES, hold_step, job_field, signal_step,
                             wait_until_ended)
from tests.twins.page_steps import page_steps
from tests.twins.stand_ins import STAND_IN
from tests.slurm.cluster import GPU_MODEL, NODES, ensure_hosts_entries

TWINS = TESTS / "twins"
PROJECT_URL = "https://github.com/hpc-train/hpc-train"
# The page's `my_train.py` (the user's own script): the project's example, 2 steps.
OWN_SCRIPT = "examples/plain_ddp.py --steps 2"
# The suite's cluster: 2 CPUs a node (tests/slurm/cluster.py), each standing for a GPU.
CLUSTER_CPUS = 2
STAND_INS = ("srun", "sbatch", "apptainer", "podman", "enroot", "git", "lfs", "shifter",
             "shifterimg")
# What the suite sets for every process it starts (tests/conftest.py's OpenMP waits; the
# Python settings of the suite's environment, its logs unbuffered), kept in the user's.
SUITE_SETTINGS = ("OMP_WAIT_POLICY", "PYTHONUNBUFFERED", "PYTHONDONTWRITEBYTECODE", "LANG")
# After a twin's own commands on every PATH it gives: the test environment's Python and
# console scripts (its user is let through to them), then the system's.
ENVIRONMENT_PATH = f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin"


def tiny_train(steps: int | str, epochs: int = 1, log_every: int = 1) -> list[str]:
    """The page's CIFAR-100 training made tiny: the stand-in download's images at 16 px,
    stopped at `steps`, a step line in the log each `log_every` ("train: step 2/2 (epoch
    1): loss ..."). The dataset stays CIFAR-100, read from the page's --data-dir: no
    dataset that needs no files stands in for it."""
    return ["--dataset", "cifar100", "--device", "cpu", "--model", "wrn", "--width", "8",
            "--blocks-per-stage", "1", "--image-size", "16", "--batch-size", "16",
            "--epochs", str(epochs), "--max-steps", str(steps), "--log-every",
            str(log_every), "--dist-timeout", "120"]


TINY_TRAIN = tiny_train(2)
FIRST_STEP = re.compile(r"train: step \d+/2 \(epoch 1\): loss")
# The page's continue step: the run its first job left at step 2 (the step limit stands
# for the time limit: both end the job with a checkpoint of its last step) goes on to 4.
CONTINUED_TRAIN = tiny_train(4)
CONTINUED_STEP = re.compile(r"train: step 4/4 \(epoch 1\): loss")
# A run that meets a real time limit (Twin.run(time_limited=True)): the jobs before the
# continue step get TIME_LIMIT_MINUTES (the page's hours scaled down; the cluster's
# KillWait is 5 s, SLURM's default 30) and a training no step limit ends first, held
# once it has taken a step (Twin.hold_once_stepping); the continue step's training goes
# CONTINUED_PAST steps past the checkpoint the limit left. A job whose header asks a
# signal before its limit (Olivia's --signal=B:USR2@300) gets SIGNALLED_LIMIT instead,
# minutes@seconds: SLURM may send the signal up to 60 s before the time asked (sbatch(1),
# --signal), so 30 s before a 2-minute limit comes 30 to 90 s after the job's start, once
# its step runs. The user's cap on time-limit requeues is then 0 (the page's
# MAX_TIME_LIMIT_RESTARTS=N): past it, the page's continue step resubmits.
TIME_LIMIT_MINUTES = 1
SIGNALLED_LIMIT = "2@30"
UNTIL_THE_TIME_LIMIT = tiny_train(10**6, epochs=10**4)
CONTINUED_PAST = 2

# The stand-in download: enough images for 4 steps of 16 on each of 4 ranks, and a test
# split, laid out and pickled as the real cifar-100-python.tar.gz holds them.
CIFAR_TRAIN_IMAGES, CIFAR_TEST_IMAGES = 320, 16
# What the twin's image runs at start-up when a command downloads (stand_ins.images.run_in_image
# puts this folder first on its PYTHONPATH): torchvision's CIFAR-100 address and
# checksums become the stand-in's, the one thing of the real internet the suite cannot
# have (a name and a certificate of www.cs.toronto.edu); the fetch, the checksums' check
# and the unpacking are torchvision's own.
INTERNET_HOOK = """\
import json, os
from torchvision.datasets import CIFAR100
served = json.loads(open(os.environ["TWIN_CIFAR_DOWNLOAD"]).read())
CIFAR100.url, CIFAR100.tgz_md5 = served["url"], served["tgz_md5"]
CIFAR100.train_list = [["train", served["train"]]]
CIFAR100.test_list = [["test", served["test"]]]
CIFAR100.meta = dict(CIFAR100.meta, md5=served["meta"])
"""


class StandInInternet:
    """The twin's internet: an HTTP server on the loopback (the cluster's nodes are this
    host) serving a small CIFAR-shaped cifar-100-python.tar.gz, and the start-up hook that
    points torchvision's download at it (INTERNET_HOOK). Whether a node may reach it at
    all is the twin's [network] table's (stand_ins.images.check_network)."""

    def __init__(self, folder: Path):
        folder.mkdir(parents=True, exist_ok=True)
        served = self.archive(folder)
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), partial(
            QuietHandler, directory=str(folder)))
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        weakref.finalize(self, self.server.shutdown)
        served["url"] = f"http://127.0.0.1:{self.server.server_port}/cifar-100-python.tar.gz"
        self.description = folder / "cifar100.json"
        self.description.write_text(json.dumps(served))
        self.hook = folder / "hook"
        self.hook.mkdir(exist_ok=True)
        (self.hook / "sitecustomize.py").write_text(INTERNET_HOOK)

    @staticmethod
    def archive(folder: Path) -> dict[str, str]:
        """The archive's files and their md5 sums (torchvision checks each)."""
        contents = write_cifar100(folder / "contents", CIFAR_TRAIN_IMAGES, CIFAR_TEST_IMAGES)
        archive = folder / "cifar-100-python.tar.gz"
        with tarfile.open(archive, "w:gz") as tar:
            tar.add(contents, arcname=contents.name)
        shutil.rmtree(contents.parent)
        md5 = {name: hashlib.md5(tar_member(archive, name)).hexdigest()
               for name in ("train", "test", "meta")}
        return md5 | {"tgz_md5": hashlib.md5(archive.read_bytes()).hexdigest()}

    def environment(self) -> dict[str, str]:
        return {"TWIN_CIFAR_DOWNLOAD": str(self.description), "TWIN_INTERNET_HOOK": str(self.hook)}


def tar_member(archive: Path, name: str) -> bytes:
    with tarfile.open(archive) as tar:
        return tar.extractfile(f"cifar-100-python/{name}").read()


class QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:  # (the test's output is the page's, not the server's)
        pass


def twin_data(site: str) -> dict:
    """A twin's tables; a machine of a centre names its centre's twin as `base` and gives
    only the keys in which it differs (each table it changes cites its own pages)."""
    data = tomllib.loads((TWINS / f"{site}.toml").read_text())
    base = data.pop("base", None)
    if not base:
        return data
    merged = twin_data(base)
    for name, value in data.items():
        merged[name] = merged.get(name, {}) | value if isinstance(value, dict) else value
    return merged


LMOD_INIT = Path("/usr/share/lmod/lmod/init/bash")  # Debian's lmod (tools/debian-packages.txt)


def module_tree(folder: Path, modules: dict, libraries: dict[str, Path]) -> Path:
    """The twin's module files for Lmod (Debian's lmod, as the centres run it), from the
    twin's cited module list; the folder MODULEPATH starts with. A module whose
    prerequisite is not loaded lives in a folder that prerequisite's file puts on
    MODULEPATH (the hierarchy: Olivia's NCCL modules under NRIS/GPU), so Lmod itself
    says it is unknown until then. An NCCL module puts its library folder on
    LD_LIBRARY_PATH and sets EasyBuild's EBROOTNCCL and EBVERSIONNCCL."""
    core = folder / "core"
    for name, spec in modules.items():
        above = spec.get("requires")
        root = folder / ("opened-by-" + above.replace("/", "-") if above else "core")
        lines = [f'whatis("the twin of {name}")']
        if spec.get("sticky"):
            lines.append('add_property("lmod", "sticky")')
        opens = [child for child, other in modules.items() if other.get("requires") == name]
        if opens:
            lines.append(f'prepend_path("MODULEPATH", "{folder}/opened-by-'
                         f'{name.replace("/", "-")}")')
        if name in libraries:
            lines += [f'prepend_path("LD_LIBRARY_PATH", "{libraries[name]}")',
                      f'setenv("EBROOTNCCL", "{libraries[name].parent}")',
                      f'setenv("EBVERSIONNCCL", "{spec["nccl"]}")']
        path = root / f"{name}.lua"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("\n".join(lines) + "\n")
    core.mkdir(parents=True, exist_ok=True)
    return core


def stand_in_nccl(folder: Path, version: str) -> Path:
    """An NCCL module's lib folder: libnccl.so.2 -> libnccl.so.X.Y.Z (a stand-in file: the
    check reads versions, and a CPU training step loads no NCCL)."""
    folder.mkdir(parents=True, exist_ok=True)
    if not (folder / "libnccl.so.2").is_symlink():
        (folder / f"libnccl.so.{version}").write_bytes(b"stand-in")
        (folder / "libnccl.so.2").symlink_to(f"libnccl.so.{version}")
    return folder


def module_settings(site: str, folder: Path, nccl_library: str | None = None) -> dict[str, str]:
    """Lmod over the twin's module files in `folder`: MODULEPATH and the modules the
    centre's login loads (what `module reset` returns to). An NCCL module's library
    reports `nccl_library`, else its cited version with major 99: the twin's image is the
    test environment, whose torch's NCCL is not the real image's, so the cited version
    would be compared with the wrong one; the binds and the check still run as on the site."""
    modules = twin_data(site)["modules"]
    libraries = {name: stand_in_nccl(folder / "software" / name.replace("/", "-") / "lib",
                                     nccl_library or "99." + spec["nccl"].split(".", 1)[1])
                 for name, spec in modules["available"].items() if "nccl" in spec}
    return {"MODULEPATH": str(module_tree(folder / "modules", modules["available"], libraries)),
            "LMOD_SYSTEM_DEFAULT_MODULES": ":".join(modules["loaded"])}


def lmod_functions() -> dict[str, str]:
    """What Lmod's bash start-up file leaves a shell: its variables and its `module` and
    `ml`, exported as functions (BASH_FUNC_module%%): for a job script that no login shell
    started (the job tests submit it, or run it with bash, themselves)."""
    shown = subprocess.run(["bash", "-c", f"source {LMOD_INIT} && env -0"], env={},
                           capture_output=True, text=True, check=True).stdout
    return {name: value for name, _, value in (item.partition("=") for item in
                                               shown.split("\0"))
            if name.startswith(("BASH_FUNC_module", "BASH_FUNC_ml", "LMOD_", "MODULESHOME"))}


@dataclass
class Result:
    status: int
    login: str                  # what the login shell printed
    jobs: dict[int, tuple[str, str]]  # job id: (final state, log)
    requests: list[dict]        # the steps' and jobs' requests at the centre's scale
    job_users: set[str]         # whose the jobs were, as SLURM shows it: name(uid)

    def text(self) -> str:
        return self.login + "".join(log for _, log in self.jobs.values())


def shown_values(values: dict) -> str:
    return " ".join(f"{name}={value}" for name, value in values.items())


def memory_fault(share: float | str | None, bundle: int) -> str | None:
    """A job's memory a GPU against the most the centre gives one (its bundle): all of a
    node's (--mem=0) for part of its GPUs, none asked, or more than the bundle."""
    if share == "node":
        shown = "all of the node's (--mem=0)"
    elif share is None:
        shown = "no memory of its own (none asked)"
    elif share > bundle:
        shown = f"{share:g} GiB"
    else:
        return None
    return f"memory a GPU: the job gives a GPU {shown}, the centre's bundle is {bundle} GiB"


def centre_faults(site: str, result: Result) -> list[str]:
    """What the page's steps and jobs ask against the centre's own figures (the twin's,
    each cited): every training rank gets the CPUs the centre gives a GPU (its node's
    cores over its GPUs, or the cpus_per_gpu it publishes), and every GPU the host memory
    the centre gives one at most, where it publishes that (mem_per_gpu_gib: a job may ask
    less, as Fir's recommended 280 of its 288). One line a fault."""
    data = twin_data(site)
    compute, slurm, runtime = data["compute"], data["slurm"], data["runtime"]
    per_gpu = compute.get("cpus_per_gpu", compute["cpus"] // compute["gpus"])
    memory = compute.get("mem_per_gpu_gib")
    faults = []
    for entry in result.requests:
        if "image_wins" in entry:
            faults.append(f"host variable: {entry['image_wins']}={entry['host']} is set on the "
                          f"host, but `{entry['step']}` sees the image's {entry['image']}: "
                          f"the runtime keeps the image's value ({entry['fix']})")
        if "entrypoint_sets" in entry:
            faults.append(f"entrypoint: `{entry['step']}` started the container with the "
                          "image's entrypoint (the EDF's entrypoint = true), run once a node, "
                          f"and every task there took its {shown_values(entry['entrypoint_sets'])}"
                          f"; this task is {shown_values(entry['task'])} (set entrypoint = false)")
        if entry.get("cpus_per_rank", per_gpu) != per_gpu:
            faults.append(f"CPUs a rank: a rank of `{entry['step']}` gets "
                          f"{entry['cpus_per_rank']} CPUs, the centre gives a GPU {per_gpu}")
        if "pyxis_workdir" in entry:
            faults.append(f"pyxis: `{entry['step']}` starts in the image's WORKDIR (no "
                          "--container-workdir): what it writes by a relative path (runs/...) "
                          "is gone with the container")
        missing = [name for name in runtime.get("multinode_modules", [])
                   if entry.get("nodes", 1) > 1 and name not in entry.get("shifter_modules",
                                                                          [name])]
        if missing:
            faults.append(f"Shifter modules: a {entry['nodes']}-node job with --module="
                          f"{','.join(entry['shifter_modules'])} has no {', '.join(missing)}: "
                          "NCCL in the image falls back to TCP sockets without a word "
                          f"(--module={','.join(entry['shifter_modules'] + missing)})")
        if entry.get("qos") in slurm.get("no_production", []):
            faults.append(f"QOS: a training job runs in {entry['qos']}"
                          + ("" if entry.get("named") else " (the default: it names none)")
                          + ", where the centre does not permit production runs "
                          "(-q regular)")
        if memory and "mem_per_gpu_gib" in entry and memory_fault(entry["mem_per_gpu_gib"],
                                                                   memory):
            faults.append(memory_fault(entry["mem_per_gpu_gib"], memory))
    return faults


class Twin:
    def __init__(self, site: str, cluster, folder: Path, user: User):
        """folder: where `user` can reach it (tests/helpers/users.py, reachable_folder)."""
        self.site, self.data, self.cluster, self.folder = site, twin_data(site), cluster, folder
        self.root, self.state, self.home = folder / "site", folder / "twin", folder / "home"
        for path in (self.root, self.state, self.home, self.state / "bin",
                     self.state / "image-bin"):
            path.mkdir(parents=True, exist_ok=True)
        # The user's home (theirs alone, as a centre's is), and the twin's state, which
        # the stand-ins write as the user (jobs.txt, requests.jsonl, image stores).
        self.normal_user, self.user = user, user.name
        for path in (self.home, self.state):
            user.own(path)
        self.home.chmod(0o700)
        for root in self.data["files"]["roots"]:  # the site's file systems, empty
            (self.root / root.lstrip("/")).mkdir(parents=True, exist_ok=True)
        # but for the images the centre keeps there (Olivia's NGC SIFs), as the
        # stand-ins' image files: their architecture and origin.
        for path, image in self.data.get("site_images", {}).get("images", {}).items():
            made = self.root / path.lstrip("/")
            made.parent.mkdir(parents=True, exist_ok=True)
            made.write_text(json.dumps(image | {"env": {}}))
        self.internet = StandInInternet(self.state / "internet")
        self.time_limited = False
        self.centre_on_cluster()
        # A node's other network name (JUWELS's "<node>i") resolves as the node's does.
        suffix = self.data["compute"].get("host_suffix")
        if suffix:
            ensure_hosts_entries(tuple(node + suffix for node in NODES))

    def centre_on_cluster(self) -> None:
        """The centre's partitions (time limits, nodes a job, a partition's QOS, the
        default) and submission rules, in the cluster's SLURM itself until the test ends
        (tests/slurm/fixture.py): a GPU model required where the centre requires one (the
        model of the cluster's stand-in GPUs), --requeue refused where the centre's pages do
        not say a job may be requeued."""
        slurm = self.data["slurm"]
        limits = {"MaxTime": slurm.get("max_time", {}), "MaxNodes": slurm.get("max_nodes", {})}
        self.cluster.add_partitions(
            {name: {key: str(values[name]) for key, values in limits.items() if name in values}
             for name in slurm["partitions"]},
            slurm["default_partition"], slurm.get("partition_qos"))
        model = slurm.get("gpu_model")
        assert model in (None, GPU_MODEL), (
            f"{self.site}'s GPU model {model} is not the cluster's ({GPU_MODEL}): give the "
            "cluster's nodes that model (tests/slurm/cluster.py)")
        rules = {"gpu_model": model} if model else {}
        if not self.data["continue"]["requeue"]:
            rules["requeue"] = "refused"
        if slurm["account_required"]:
            rules["account"] = "required"
        self.cluster.set_submit_rules(rules)
        self.accounts_on_cluster()

    def accounts_on_cluster(self) -> None:
        """The centre's account (the user's only one, so its default) and its QOS with
        their limits and default, in SLURM's accounting: SLURM refuses another account, a
        QOS the centre lacks (a twin with no QOS list: every one) and a job over a QOS's
        limit, and puts a job that names none in the default QOS (Perlmutter's debug)."""
        slurm = self.data["slurm"]
        if "account" not in slurm:
            assert not slurm.get("qos"), f"{self.site}: a QOS list needs the twin's account"
            return
        limits = slurm.get("qos_limits", {})
        self.cluster.set_centre_accounting(
            slurm["account"], {name: limits.get(name, "") for name in slurm.get("qos", [])},
            slurm.get("default_qos"))

    def substitute(self, text: str, train: list[str] = TINY_TRAIN) -> str:
        """The documented substitutions (module docstring)."""
        slurm = self.data["slurm"]
        if slurm.get("account_placeholder"):
            text = text.replace(slurm["account_placeholder"], slurm["account"])
        text = text.replace("<project>", slurm.get("account", "<project>"))
        for root in self.data["files"]["roots"]:
            text = re.sub(rf"(?<![\w./~-]){re.escape(root)}(?=/|\s|$)", f"{self.root}{root}", text)
        # The user's own script, and a process per GPU: one per CPU of the cluster's nodes.
        text = text.replace("my_train.py", OWN_SCRIPT)
        text = re.sub(r"--nproc-per-node=\d+", f"--nproc-per-node={CLUSTER_CPUS}", text)
        return text.replace("--dataset cifar100", shlex.join(train))

    def config(self) -> Path:
        files = self.data["files"]
        config = {**{k: self.data[k] for k in ("slurm", "compute", "login", "network")},
                  "roots": files["roots"], "root_dir": str(self.root),
                  "state": str(self.state), "repo": str(REPO), "project_url": PROJECT_URL,
                  "srun": shutil.which("srun"), "sbatch": shutil.which("sbatch"),
                  "cluster_cpus": CLUSTER_CPUS, "runtime": self.data["runtime"],
                  "edf_folder": self.data["runtime"].get("edf_folder", ".edf"),
                  "image_path": f"{self.state / 'image-bin'}:{ENVIRONMENT_PATH}"}
        path = self.state / "config.json"
        path.write_text(json.dumps(config))
        return path

    def environment(self) -> dict[str, str]:
        """The login shell's environment, a user's as a login gives it (none of the
        suite's own but its settings for every process, SUITE_SETTINGS): the stand-ins
        first on PATH, the module command, the user's variables and folders (theirs),
        the cluster's SLURM_CONF."""
        for name in STAND_INS:
            program = self.state / "bin" / name
            program.write_text(f"#!/bin/bash\nexec {shlex.join(STAND_IN)} {name} \"$@\"\n")
            program.chmod(0o755)
        entrypoint = self.state / "image-bin" / "entrypoint.sh"
        if not entrypoint.exists():
            entrypoint.symlink_to(REPO / "entrypoint.sh")
        variables = {}
        for name, value in self.data["files"].get("variables", {}).items():
            variables[name] = self.substitute(value.format(user=self.user))
            self.users_folder(variables[name])
        # The user's other folders and their project's (Olivia's work area, JSC's
        # $PROJECT and $SCRATCH), and links in the home folder (Alliance's ~/scratch) to
        # folders on a site file system.
        for folder in (*self.data["files"].get("folders", []),
                       *self.data["files"].get("project_folders", []),
                       *self.data["login"].get("jutil", {}).values()):
            self.users_folder(folder.format(user=self.user))
        # A job's own folder (Alliance's $SLURM_TMPDIR) is made by the centre's prolog as
        # root, the job's user's; the stand-in makes it in the job, as the user, in a
        # folder that lets every user make one (sticky, as /tmp).
        for value in self.data["compute"].get("job_variables", {}).values():
            per_job = Path(self.substitute(value.format(user=self.user, job="0"))).parent
            per_job.mkdir(parents=True, exist_ok=True)
            per_job.chmod(0o1777)
        for name, target in self.data["files"].get("home_links", {}).items():
            real = self.users_folder(target.format(user=self.user))
            if not (self.home / name).is_symlink():
                (self.home / name).symlink_to(real)
        suite = {name: os.environ[name] for name in SUITE_SETTINGS if name in os.environ}
        return suite | variables | {
            "PATH": f"{self.state / 'bin'}:{ENVIRONMENT_PATH}",
            "HOME": str(self.home), "USER": self.user, "LOGNAME": self.user,
            "SHELL": "/bin/bash", "SLURM_CONF": str(self.cluster.conf),
            "TWIN_CONFIG": str(self.config()),
            "TWIN_TRAIN_ARGS": json.dumps(TINY_TRAIN), "PYTHONPATH": str(REPO),
            **self.internet.environment(),
            **module_settings(self.site, self.root),
            **self.login_functions()}

    def users_folder(self, folder: str) -> Path:
        """A folder on a site file system given to the user (or their project: a
        member may write it), the user's; the folders above it the centre's (root's)."""
        path = Path(self.substitute(folder))
        path.mkdir(parents=True, exist_ok=True)
        self.normal_user.own(path)
        return path

    def login_functions(self) -> dict[str, str]:
        """The centre's login shell functions: JSC's `jutil env activate -p PROJECT`
        exports the project's variables (the twin's table: PROJECT, SCRATCH)."""
        variables = self.data["login"].get("jutil")
        if not variables:
            return {}
        exports = " ".join(f"{name}={shlex.quote(self.substitute(value))}"
                           for name, value in variables.items())
        return {"BASH_FUNC_jutil%%": (
            "() { if [[ \"$1 $2\" == 'env activate' && $3 == -p && "
            f"$4 == {shlex.quote(self.data['slurm']['account'])} ]]; then "
            f"export {exports}; else "
            "printf 'jutil: %s: not a project of yours\\n' \"$4\" >&2; return 1; fi; }")}

    def login_script(self, page: str, continue_run: bool = True) -> str:
        # The login shell's `module` and `ml` are Lmod's (its bash start-up file exports
        # them to the jobs, as at the centres).
        lines = [f"source {LMOD_INIT}", "set -e"]
        if self.data["modules"]["loaded"]:  # what the centre's login loads (Lmod's restore)
            lines.append("module --initial_load --no_redirect restore")
        for number, step in enumerate(page_steps(page), 1):
            if step.kind == "continue" and not continue_run:
                continue
            lines.append(f"echo '== step {number} (page line {step.line}, {step.kind})' >&2")
            if step.kind == "continue":
                lines += self.continuation()
                lines.append(self.substitute(step.text, CONTINUED_TRAIN).replace(
                    "<jobid>", f"$(head -n 1 {self.state / 'jobs.txt'})"))
            elif step.kind == "batch":
                script = self.state / f"batch-step-{number}.sbatch"
                header = [row for row in (REPO / step.header).read_text().splitlines()
                          if row.startswith("#SBATCH ")]
                script.write_text(self.substitute("\n".join(
                    ["#!/usr/bin/env bash", *header, "set -Eeuo pipefail", step.text])))
                lines.append(f"sbatch {script}")
            else:
                lines.append(self.substitute(step.text))
        return "\n".join(lines) + "\n"

    def continuation(self) -> list[str]:
        """Before a continue step: the user waits until the jobs before it have ended (each
        left its checkpoint), and the continued training goes on past their step limit
        (after a time limit: CONTINUED_PAST steps past the first job's last checkpoint)."""
        jobs = self.state / "jobs.txt"
        waited = [f"for job in $(cat {jobs}); do while squeue -h -j $job -t PD,CF,R,CG,S "
                  "2>/dev/null | grep -q .; do sleep 1; done; done"]
        if not self.time_limited:
            return [f"export TWIN_TRAIN_ARGS={shlex.quote(json.dumps(CONTINUED_TRAIN))}",
                    *waited]
        further = json.dumps(tiny_train("@STEP@", epochs=10**4, log_every=1))
        return [*waited, "unset TWIN_TIME_LIMIT",
                f"step=$(find {self.root} {self.home} -path \"*/runs/$(head -n 1 {jobs})/"
                "checkpoints/step-*\" -prune -printf '%f\\n' | sed 's/^step-0*//' | "
                "sort -n | tail -n 1)",
                f"export TWIN_TRAIN_ARGS=\"$(printf '%s' {shlex.quote(further)} | "
                f"sed \"s/@STEP@/$((step + {CONTINUED_PAST}))/\")\""]

    def run(self, page: str, timeout: float = 400, launch_check: bool = False,
            continue_run: bool = True, steps_check: bool = False,
            time_limited: bool = False) -> Result:
        """launch_check: the job scripts run the layout's check instead of training
        (LAUNCH_CHECK=1, jobs/lib/launch.sh); steps_check: so do the page's own training
        steps (TWIN_STEPS_CHECK=1, stand_ins/slurm.layout_check): the same steps asked of SLURM,
        without torch. A check leaves no checkpoint, so the continue steps are left out
        under launch_check, as they are when not continue_run. time_limited: the jobs
        before the continue step train until SLURM ends them at a real time limit
        (TIME_LIMIT_MINUTES, UNTIL_THE_TIME_LIMIT)."""
        self.time_limited = time_limited
        env = self.environment() | ({"LAUNCH_CHECK": "1"} if launch_check else {}) | (
            {"TWIN_STEPS_CHECK": "1"} if steps_check else {}) | ({
                "TWIN_TIME_LIMIT": str(TIME_LIMIT_MINUTES),
                "TWIN_SIGNALLED_LIMIT": SIGNALLED_LIMIT, "MAX_TIME_LIMIT_RESTARTS": "0",
                "TWIN_TRAIN_ARGS": json.dumps(UNTIL_THE_TIME_LIMIT)} if time_limited else {})
        script = self.login_script(page, continue_run and not launch_check)
        with subprocess.Popen([*self.normal_user.setpriv(), "bash", "-c", script], env=env,
                              cwd=self.home, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) as login:
            try:  # the login ended whatever fails here (Popen's exit waits for it)
                if time_limited:
                    self.hold_once_stepping(login)
                output, _ = login.communicate(timeout=timeout)
            finally:
                login.kill()
        jobs, users = {}, set()
        listed = self.state / "jobs.txt"
        for job in (listed.read_text().split() if listed.exists() else []):
            state = wait_until_ended(self.cluster, int(job), self.state / "none", timeout)
            shown = self.cluster.run(["scontrol", "show", "job", job]).stdout
            log = Path(re.search(r"StdOut=(\S+)", shown).group(1))
            jobs[int(job)] = (state, log.read_text() if log.exists() else "")
            users.add(re.search(r"UserId=(\S+)", shown).group(1))
        asked = self.state / "requests.jsonl"
        requests = [json.loads(line) for line in
                    (asked.read_text().splitlines() if asked.exists() else [])]
        return Result(login.returncode, output, jobs, requests, users)

    def hold_once_stepping(self, login: subprocess.Popen) -> None:
        """The page's first job, once its training has taken a step, held on each of its
        nodes (SIGSTOP to the step's processes, until every one is stopped) until SLURM
        resumes it: at the time limit with SIGCONT beside its SIGTERM, which then meets a
        step in flight as it would unheld; or, for a signal before the limit, which SLURM
        sends the batch shell alone (`B:`), resumed here once the batch shell says it
        passed it on to the step (jobs/lib/requeue.sh's "SIGUSR2 received"), so that the
        held ranks take it. Its 4 ranks training flat out until the limit (a minute or
        more: SLURM checks limits every 30 s) took about 100 CPU-seconds of the suite's
        budget. Nothing is held where the page's steps end first."""
        listed = self.state / "jobs.txt"
        first: dict[str, object] = {}

        def stepping_or_ended() -> bool:
            if login.poll() is not None:
                return True
            if "log" not in first and listed.exists() and listed.read_text().split():
                first["job"] = int(listed.read_text().split()[0])
                if out := job_field(self.cluster, first["job"], "StdOut"):
                    first["log"] = Path(out)
            log = first.get("log")
            return log is not None and log.is_file() and "train: step " in log.read_text()

        wait_for(stepping_or_ended, "the page's first job to train a step", listed,
                 timeout=300, poll=0.2)
        if login.poll() is not None:
            return
        job, log = first["job"], first["log"]
        nodes = hostlist.expand_hostlist(job_field(self.cluster, job, "NodeList"))

        def signalled() -> bool:
            return "SIGUSR2 received" in log.read_text()

        def signalled_or_ended() -> bool:
            return signalled() or job_field(self.cluster, job, "JobState") in ENDED_STATES

        for node in nodes:
            hold_step(self.cluster, job, log, node, unless=signalled_or_ended)
        wait_for(signalled_or_ended, "the signal before the limit, or the limit", log,
                 timeout=300, poll=0.5)
        if signalled():
            for node in nodes:
                signal_step(self.cluster, job, signal.SIGCONT, node)
