"""The commands of a centre's twin (tests/helpers/twins.py): thin stand-ins for what the
suite's machine lacks, each failing where the real one fails.

    twin_bin.py NAME ARGS...    NAME: srun sbatch apptainer podman enroot git lfs ce-task
                                      pyxis-task shifter shifterimg

TWIN_CONFIG names the twin's JSON (written by twins.py): the centre's node shape,
partitions, account, architectures, file-system roots, the real srun/sbatch and the
SLURM cluster's CPUs a node. A compute node is where SLURM_JOB_ID is set (a job or a
step); the login node everywhere else.

- srun/sbatch check a request against the centre's nodes and partition names (its
  account and QOS are SLURM's accounting's, twins.py), with SLURM's own messages (a
  count of 0, as `$((SLURM_CPUS_ON_NODE / 4))` is outside a job, included), then ask the
  cluster for what it has (its CPUs, its stand-in GPUs with the request's model; no
  memory size), where SLURM itself applies the centre's partitions' time limits and its
  submission rules (tests/helpers/twins.py puts them there); sbatch adds the tiny
  training's arguments (TWIN_TRAIN_ARGS) to the job's and sets the centre's job
  variables ($SLURM_TMPDIR). The job sees its request as the centre's SLURM gives it
  (SLURM_CPUS_PER_TASK, SLURM_GPUS_PER_NODE), so the job's own arithmetic runs on the
  centre's numbers; srun scales them to the cluster's. Each step that trains, and each
  job, is written to requests.jsonl (the CPUs each rank gets, the memory a GPU gets, at
  the centre's scale) for the site test to hold against the centre's figures. `srun
  --environment=EDF` is CSCS's Container Engine; `srun --container-image=FILE` is pyxis.
  Under TWIN_STEPS_CHECK=1 (a page mistake's run) a training step's program is the
  layout's check.
- A runtime the centre puts in a module (Alliance's `module load apptainer`) is "command
  not found" until that module is loaded.
- An image is a small JSON file naming its architecture: built (apptainer build, podman
  build) on the node's, pulled for --arch or the node's. Running one on a node of
  another architecture is refused with Apptainer's message; running it runs the host's
  Python environment as the image's, with the container's environment rules. Under
  pyxis a site path the command names must be under --container-mounts; `podman run`
  runs a locally built image through its entrypoint.
- What reaches the internet (a build's or pull's registry, `git clone`, `train
  --download`) does so from a compute node only as the twin's [network] table allows:
  through the centre's proxy, set in the command's environment, directly, or not at all;
  `train --download` then fetches the stand-in internet's CIFAR-shaped archive.
"""

from __future__ import annotations

import json
import os
import re
import sys
import tomllib
from pathlib import Path

from tests.helpers.apptainer_def import header, rendered

GO_ARCH = {"aarch64": "arm64", "x86_64": "amd64"}
VALUE_OPTIONS = {"nodes", "ntasks", "ntasks-per-node", "cpus-per-task", "account",
                 "partition", "time", "output", "error", "job-name", "gpus", "gpus-per-node",
                 "gpus-per-task", "mem", "mem-per-cpu", "mem-per-gpu", "constraint",
                 "environment", "uenv", "view", "image", "module", "gres", "cpu-bind", "export",
                 "chdir", "container-image", "container-mounts", "container-workdir",
                 "container-env", "qos"}
SHORT = {"-N": "nodes", "-n": "ntasks", "-c": "cpus-per-task", "-A": "account",
         "-p": "partition", "-t": "time", "-o": "output", "-e": "error", "-J": "job-name",
         "-G": "gpus", "-C": "constraint", "-q": "qos"}
# The ways to ask GPUs, in the order gpu_request reads them.
GPU_OPTIONS = ("gpus-per-node", "gpus", "gres", "gpus-per-task")
# What the cluster cannot have: asked of the twin's nodes, then left out for the cluster
# (a GPU request goes to the cluster scaled to its stand-in GPUs: scaled_gpus).
PYXIS = {"container-image", "container-mounts", "container-workdir", "container-env",
         "container-entrypoint", "no-container-entrypoint", "container-writable",
         "container-readonly"}
SITE_ONLY = {"mem", "mem-per-cpu", "mem-per-gpu", "constraint", "uenv", "view",
             "image", "module", "environment", *GPU_OPTIONS} | PYXIS
NOT_AVAILABLE = "Requested node configuration is not available"
# What the job sees as the centre's SLURM sets it; srun gives the cluster its own back.
CENTRE_VIEW = ("SLURM_CPUS_PER_TASK", "SLURM_GPUS_PER_NODE")


def fail(message: str, status: int = 1):
    sys.stderr.write(message + "\n")
    sys.exit(status)


CONFIG = json.loads(Path(os.environ["TWIN_CONFIG"]).read_text())


def on_compute() -> bool:
    return bool(os.environ.get("SLURM_JOB_ID"))


def node_arch() -> str:
    return CONFIG["compute"]["arch"] if on_compute() else CONFIG["login"]["arch"]


def site_path(path: str) -> Path:
    """A path as the page writes it, on the twin: under a site root, it is below the
    twin's root folder."""
    for root in CONFIG["roots"]:
        if path == root or path.startswith(root + "/"):
            return Path(CONFIG["root_dir"] + path)
    return Path(path)


# ------------------------------------------------------------------ SLURM requests
def parse_options(args: list[str]) -> tuple[list[tuple[str, str | None]], list[str]]:
    """(options in order, the command after them)."""
    options, i = [], 0
    while i < len(args) and args[i].startswith("-"):
        arg = args[i]
        if arg.startswith("--"):
            name, eq, value = arg[2:].partition("=")
            if not eq and name in VALUE_OPTIONS:
                i, value = i + 1, args[i + 1]
            options.append((name, value if (eq or name in VALUE_OPTIONS) else None))
        else:
            name = SHORT.get(arg[:2])
            if name is None:
                fail(f"twin: {arg}: an option the twin does not know; add it to "
                     "tests/helpers/twin_bin.py")
            value = arg[2:] or args[i + 1]
            i += 0 if arg[2:] else 1
            options.append((name, value))
        i += 1
    return options, args[i:]


def memory_gib(value: str) -> float:
    number, unit = re.fullmatch(r"(\d+)([KMGT]?)B?", value.upper()).groups()
    return int(number) / {"K": 1024 ** 2, "M": 1024, "G": 1, "T": 1 / 1024, "": 1024}[unit]


def check_numbers(program: str, options: dict[str, str | None]) -> None:
    """SLURM parses a count before anything else: `--cpus-per-task=$((X / 4))` typed
    where X is unset (outside a job) is 0, and srun stops (its message, Slurm 24.11)."""
    for name in ("nodes", "ntasks", "ntasks-per-node", "cpus-per-task"):
        value = options.get(name)
        if value is not None and not (value.isdigit() and int(value) > 0):
            fail(f'{program}: error: Invalid numeric value "{value}" for --{name}.')


def gpu_request(options: dict[str, str | None]) -> tuple[str, str, int] | None:
    """(the option, its GPU model or "", GPUs a node) of a GPU request, else None."""
    nodes = int(options.get("nodes") or 1)
    for name in GPU_OPTIONS:
        value = options.get(name)
        if not value or (name == "gres" and not value.startswith("gpu")):
            continue
        model, _, count = value.removeprefix("gpu").lstrip(":").rpartition(":")
        count = int(count or 1)
        per_node = (count // nodes if name == "gpus" else
                    count * int(options.get("ntasks-per-node") or 1) if name == "gpus-per-task"
                    else count)
        return name, model, max(per_node, 1)
    return None


def check_request(program: str, options: dict[str, str | None]) -> None:
    """Refuse what the centre would refuse, with SLURM's messages."""
    slurm, node = CONFIG["slurm"], CONFIG["compute"]
    refused = ("sbatch: error: Batch job submission failed: " if program == "sbatch"
               else "srun: error: Unable to allocate resources: ")
    # The cluster's own partitions (debug, low, high) are there beside the centre's, so
    # the centre's list is checked here; SLURM checks the time limit and the default.
    partition = options.get("partition") or slurm["default_partition"]
    if partition not in slurm["partitions"]:
        fail(f"{program}: error: invalid partition specified: {partition}\n"
             f"{refused}Invalid partition name specified")
    features = slurm.get("constraints")
    if features and options.get("constraint") not in features:
        fail(f"{refused}Invalid feature specification (this centre's nodes: "
             f"-C {' or -C '.join(features)})")
    # The account and the QOS are SLURM's own (the cluster's accounting holds the twin's
    # account, its QOS and their limits: twins.py), as are the input variables that give
    # them (sbatch: SBATCH_ACCOUNT, srun: SLURM_ACCOUNT).
    gpu_partitions = slurm.get("gpu_partitions")
    if gpu_partitions and gpu_request(options) and partition not in gpu_partitions:
        fail(refused + NOT_AVAILABLE)  # GPUs asked of a partition whose nodes have none
    per_node = int(options.get("ntasks-per-node") or 1)
    gpus = (gpu_request(options) or ("", "", 0))[2]
    too_big = (per_node * int(options.get("cpus-per-task") or 1) > node["cpus"]
               or gpus > node["gpus"]
               or ("memory_gib" in node and options.get("mem")
                   and memory_gib(options["mem"]) > node["memory_gib"]))
    if too_big:
        fail(refused + NOT_AVAILABLE)


def scaled_gpus(options: dict[str, str | None], cpus: int) -> dict[str, str]:
    """The GPU request for the cluster's nodes, one stand-in GPU a CPU: the same option
    and GPU model, the count a node at most `cpus`. SLURM itself then refuses a model its
    nodes have not, and the cluster's job_submit.lua an untyped request where the centre
    requires a model (tests/slurm/job_submit.lua)."""
    request = gpu_request(options)
    if not request:
        return {}
    name, model, per_node = request
    per_node = min(per_node, cpus)
    typed = f"{model}:" if model else ""
    if name == "gres":
        return {name: f"gpu:{typed}{per_node}"}
    if name == "gpus":
        nodes = int(options.get("nodes") or os.environ.get("SLURM_NNODES") or 1)
        return {name: f"{typed}{per_node * nodes}"}
    if name == "gpus-per-task":
        tasks = min(int(options.get("ntasks-per-node") or 1), cpus)
        return {name: f"{typed}{max(per_node // tasks, 1)}"}
    return {name: f"{typed}{per_node}"}


def for_the_cluster(options: dict[str, str | None]) -> list[str]:
    """The request, scaled to the cluster's nodes (CLUSTER_CPUS each, a stand-in GPU a
    CPU)."""
    cpus = int(os.environ.get("SLURM_CPUS_ON_NODE") or CONFIG["cluster_cpus"])
    kept = {name: value for name, value in options.items() if name not in SITE_ONLY}
    kept |= scaled_gpus(options, cpus)
    if "ntasks" in kept and "ntasks-per-node" not in kept and "nodes" in kept:
        # srun -n8 -N2 (CSCS's Slurm page): the tasks spread over the nodes, a node's
        # share as the request would give it, scaled to the cluster's CPUs.
        per_node = -(-int(kept["ntasks"]) // int(kept["nodes"]))
        kept["ntasks"] = str(int(kept["nodes"]) * min(per_node, cpus))
        spread = str(min(per_node, cpus))
    else:
        spread = None
    if "ntasks-per-node" in kept:
        kept["ntasks-per-node"] = str(min(int(kept["ntasks-per-node"]), cpus))
        if "ntasks" in kept:
            kept["ntasks"] = str(int(kept.get("nodes") or os.environ.get("SLURM_NNODES", 1))
                                 * int(kept["ntasks-per-node"]))
    if "cpus-per-task" in kept:
        # Tasks a node: the request's, else (a step in a job) the job's, "4" or "4(x2)".
        per_node = kept.get("ntasks-per-node") or spread or re.match(
            r"\d*", os.environ.get("SLURM_NTASKS_PER_NODE", "")).group() or 1
        kept["cpus-per-task"] = str(max(1, min(int(kept["cpus-per-task"]),
                                               cpus // int(per_node))))
    return [f"--{name}" if value is None else f"--{name}={value}" for name, value in kept.items()]


def record(entry: dict) -> None:
    """A request at the centre's scale, for the site test (requests.jsonl)."""
    with open(Path(CONFIG["state"]) / "requests.jsonl", "a") as requests:
        requests.write(json.dumps(entry) + "\n")


def trains(command: list[str]) -> bool:
    """A step whose tasks are training ranks: train, torchrun, a script, or the job
    scripts' check of that layout (LAUNCH_CHECK=1); not the data step, which only
    fetches."""
    check = [arg for arg in command if arg in ("workload.launch", "check")]
    return "--prepare-data" not in command and (check == ["workload.launch", "check"] or any(
        Path(arg).name in ("train", "torchrun") or arg.endswith(".py") for arg in command))


def record_ranks(options: dict[str, str | None], command: list[str]) -> None:
    """The CPUs each training rank of the step gets, as the centre's SLURM gives them: the
    step's --cpus-per-task, else the job's (srun inherits it, SRUN_CPUS_PER_TASK since
    Slurm 23.11); a torchrun task shares its CPUs among the node's GPUs."""
    if not trains(command):
        return
    cpus = int(options.get("cpus-per-task") or (
        os.environ.get("SLURM_CPUS_PER_TASK") if on_compute() else None) or 1)
    per_node = int(options.get("ntasks-per-node") or 1)
    ranks = (CONFIG["compute"]["gpus"] // per_node
             if any(Path(arg).name == "torchrun" for arg in command) else 1)
    record({"step": " ".join(command[:3]), "cpus_per_rank": cpus // max(ranks, 1)})


TRAINING_PROGRAMS = ("train", "torchrun", "entrypoint.sh")


def layout_check(command: list[str]) -> list[str]:
    """A training step's command as the job scripts run it under LAUNCH_CHECK=1
    (workload.launch.jobstep.check_command): what starts the container kept, the training
    program (train, entrypoint.sh torchrun ..., a script) replaced by the layout's check."""
    start = next(index for index, arg in enumerate(command)
                 if Path(arg).name in TRAINING_PROGRAMS or arg.endswith(".py"))
    if start and Path(command[start - 1]).name.startswith("python"):  # python my_train.py
        start -= 1
    programs = {Path(arg).name for arg in command[start:]}
    torchrun = ["--command", "torchrun"] if "torchrun" in programs else []
    return command[:start] + ["python", "-m", "workload.launch", "check", *torchrun]


def srun(args: list[str]) -> None:
    listed, command = parse_options(args)
    options = dict(listed)
    check_numbers("srun", options)
    if not on_compute():
        check_request("srun", options)
    elif int(options.get("cpus-per-task") or 1) > CONFIG["compute"]["cpus"]:
        fail("srun: error: Unable to create step for job "
             f"{os.environ['SLURM_JOB_ID']}: More processors requested than permitted")
    record_ranks(options, command)
    # A mistake's run (TWIN_STEPS_CHECK=1): a page's own training steps run the layout's
    # check, as its job scripts do then; every check above and each runtime's below still
    # applies.
    if (os.environ.get("TWIN_STEPS_CHECK") == "1" and trains(command)
            and "workload.launch" not in command):
        command = layout_check(command)
    # The cluster's own values of what the job saw at the centre's scale.
    for name, value in json.loads(os.environ.pop("TWIN_CLUSTER_VIEW", "{}")).items():
        if not value:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    if options.get("environment"):
        command = [sys.executable, __file__, "ce-task", str(find_edf(options["environment"])),
                   "--", *command]
    if options.get("container-image"):
        command = [sys.executable, __file__, "pyxis-task", json.dumps(options), "--", *command]
    # A step that is its own job (srun at the login prompt): the job's variables too.
    if not on_compute() and job_variables():
        command = ["bash", "-c", "".join(job_variables()) + 'exec "$@"', "srun", *command]
    os.execv(CONFIG["srun"], ["srun", *for_the_cluster(options), *command])


def script_header(script: Path) -> list[tuple[str, str | None]]:
    options = []
    for line in script.read_text().splitlines()[1:]:
        if not line.startswith("#"):
            break
        if line.startswith("#SBATCH "):
            options += parse_options(line.split(None, 1)[1].split())[0]
    return options


def centre_view(options: dict[str, str | None]) -> list[str]:
    """The job's request as the centre's SLURM shows it to the job (its CPUs a task, its
    GPUs a node), the cluster's own values kept for srun (TWIN_CLUSTER_VIEW)."""
    view = {"SLURM_CPUS_PER_TASK": options.get("cpus-per-task"),
            "SLURM_GPUS_PER_NODE": options.get("gpus-per-node")}
    if not any(view.values()):
        return []
    kept = ", ".join(f'\\"{name}\\": \\"${{{name}:-}}\\"' for name in CENTRE_VIEW)
    return [f'export TWIN_CLUSTER_VIEW="{{{kept}}}"\n',
            "".join(f"export {name}={value}\n" for name, value in view.items() if value)]


def with_job_variables(lines: list[str], options: dict[str, str | None]) -> list[str]:
    """The variables the centre's job starts with (Alliance's $SLURM_TMPDIR, a node-local
    folder made for the job; the request as the centre's SLURM gives it), set after the
    script's header as the centre's prolog would before it."""
    body = next((i for i, line in enumerate(lines) if i and not line.startswith("#")),
                len(lines))
    return lines[:body] + centre_view(options) + job_variables() + lines[body:]


def job_variables() -> list[str]:
    """The shell lines that set the centre's job variables (Alliance's $SLURM_TMPDIR, made
    for the job), in a job's batch shell or around a step srun allocates itself."""
    made = []
    for name, value in CONFIG["compute"].get("job_variables", {}).items():
        path = CONFIG["root_dir"] + value.format(user=os.environ["USER"], job="${SLURM_JOB_ID}")
        made.append(f'export {name}="{path}"; mkdir -p "${{{name}}}"\n')
    return made


def record_memory(listed: list[tuple[str, str | None]]) -> None:
    """The host memory a GPU of the job gets: --mem-per-gpu, --mem over the GPUs a node,
    or "node" for --mem=0 (all of each node's memory, whatever its GPUs). The options
    exclude each other: the last given wins (the command line's over the header's)."""
    request = gpu_request(dict(listed))
    if not request:
        return
    name, value = next(((n, v) for n, v in reversed(listed) if n in ("mem", "mem-per-gpu")),
                       (None, None))
    if name == "mem-per-gpu":
        share = memory_gib(value)
    elif name == "mem":
        share = memory_gib(value) / request[2] if memory_gib(value) else "node"
    else:
        share = None
    record({"job": Path(CONFIG["state"]).name, "mem_per_gpu_gib": share})


def record_qos(job: str, options: dict[str, str | None]) -> None:
    """The QOS SLURM put the job in (its own, else its association's default: Perlmutter's
    debug), for the site test to hold against where the centre permits production runs."""
    import subprocess
    shown = subprocess.run(["scontrol", "show", "job", job], capture_output=True, text=True)
    qos = re.search(r"\bQOS=(\S+)", shown.stdout)
    record({"job": Path(CONFIG["state"]).name, "qos": qos.group(1) if qos else None,
            "named": bool(options.get("qos"))})


def record_shifter_modules(options: dict[str, str | None]) -> None:
    """Shifter's modules of a job (sbatch --module; the centre's default where none is
    given), for the site test to hold against the ones a multi-node job needs (NERSC's
    nccl-plugin: without it NCCL in the image has no Slingshot plugin)."""
    needed = CONFIG["runtime"].get("multinode_modules")
    if needed:
        given = (options.get("module") or "").split(",")
        record({"job": Path(CONFIG["state"]).name, "shifter_modules": [m for m in given if m],
                "nodes": int(options.get("nodes") or 1)})


def sbatch(args: list[str]) -> None:
    listed, rest = parse_options(args)
    script = Path(rest[0])
    listed = script_header(script) + listed
    options = dict(listed)  # the command line wins, as in sbatch
    if os.environ.get("TWIN_TIME_LIMIT"):  # the page's hours scaled to a real, short limit
        options["time"] = os.environ["TWIN_TIME_LIMIT"]
    check_numbers("sbatch", options)
    check_request("sbatch", options)
    # The script without the header lines the cluster cannot have (the command line
    # gives the scaled request).
    jobs = Path(CONFIG["state"]) / "jobs"
    jobs.mkdir(exist_ok=True)
    copy = jobs / f"{len(os.listdir(jobs))}-{script.name}"
    lines = [line for line in script.read_text().splitlines(keepends=True)
             if not (line.startswith("#SBATCH ") and
                     parse_options(line.split(None, 1)[1].split())[0][0][0] in SITE_ONLY | {
                         "cpus-per-task", "ntasks-per-node"})]
    copy.write_text("".join(with_job_variables(lines, options)))
    if options.get("image"):  # Shifter's image for the job's `shifter` commands
        os.environ["TWIN_SHIFTER_IMAGE"] = options["image"]
    record_memory(listed)
    record_shifter_modules(options)
    import subprocess
    done = subprocess.run([CONFIG["sbatch"], *for_the_cluster(options), str(copy), *rest[1:],
                           *json.loads(os.environ.get("TWIN_TRAIN_ARGS", "[]"))],
                          capture_output=True, text=True)
    sys.stdout.write(done.stdout)
    sys.stderr.write(done.stderr)
    found = re.search(r"Submitted batch job (\d+)", done.stdout)
    if found:
        with open(Path(CONFIG["state"]) / "jobs.txt", "a") as jobs:
            jobs.write(found.group(1) + "\n")
        record_qos(found.group(1), options)
    sys.exit(done.returncode)


# ------------------------------------------------------------------ images
def write_image(path: Path, arch: str, origin: str, env: dict[str, str] | None = None) -> None:
    """An image: its architecture, its origin and the variables its recipe sets (ENV)."""
    if not path.parent.is_dir():
        fail(f"FATAL:   While performing build: {path.parent}: no such file or directory")
    path.write_text(json.dumps({"arch": arch, "from": origin, "env": env or {}}))


def recipe_env(context: Path) -> dict[str, str]:
    """The ENV instructions of the Dockerfile a build reads (KEY=VALUE pairs, lines joined
    at a trailing backslash; an ARG in a value stays as written)."""
    recipe = context / "Dockerfile"
    text = recipe.read_text().replace("\\\n", " ") if recipe.is_file() else ""
    return {key: value.strip('"') for line in text.splitlines() if line.startswith("ENV ")
            for key, value in re.findall(r"(\w+)=(\S+)", line)}


def image_arch(path: Path) -> str:
    if not path.is_file():
        fail(f"FATAL:   could not open image {path}: failed to retrieve path for {path}: "
             f"lstat {path}: no such file or directory", 255)
    return json.loads(path.read_text())["arch"]


def check_network(what: str, env: dict[str, str] | None = None) -> None:
    """What reaches the internet, on a compute node, as the centre's network allows (the
    twin's [network] table, cited): through its proxy, set in `env` (the environment the
    command runs with), directly, or not at all. Login nodes reach it."""
    network = CONFIG["network"]
    env = os.environ if env is None else env
    if not on_compute() or network["compute"] == "direct":
        return
    if network["compute"] == "none":
        fail(f"{what}: Failed to establish a new connection: [Errno 101] Network is "
             "unreachable (this centre's compute nodes do not reach the internet; "
             "run it on a login node)", 255)
    if env.get("https_proxy") != network["proxy"]:
        fail(f"{what}: Failed to establish a new connection: [Errno 101] Network is "
             "unreachable (no https_proxy: the compute nodes reach the internet only "
             f"through {network['proxy']})", 255)


def check_arch(image: Path) -> None:
    """Apptainer's check (apptainer/apptainer#2847 quotes it): an image of another
    architecture than the node's is refused."""
    arch, host = image_arch(image), GO_ARCH[node_arch()]
    if arch != host:
        fail(f"FATAL:   While checking container encryption: could not open image {image}: "
             f"the image's architecture ({arch}) could not run on the host's ({host})", 255)


def run_in_image(command: list[str], library_path: str, env: dict[str, str]) -> None:
    """The host's Python environment as the image's: its PATH, the given library path. A
    download (`train --download`) needs the internet from where it runs, and there reaches
    the twin's stand-in internet (twins.StandInInternet: its start-up hook first on
    PYTHONPATH)."""
    if "--download" in command:
        program = next((arg for arg in command if Path(arg).name == "train"), command[0])
        check_network(f"{Path(program).name} --download", env)
        env["PYTHONPATH"] = ":".join(filter(None, (env.get("TWIN_INTERNET_HOOK"),
                                                   env.get("PYTHONPATH"))))
        # The route was the centre's (its proxy checked above); the stand-in internet is
        # this host's loopback, which the centre's proxy address would not reach.
        env["no_proxy"] = env["NO_PROXY"] = "127.0.0.1"
    env["PATH"] = CONFIG["image_path"]
    env["LD_LIBRARY_PATH"] = ":".join(part for part in library_path.split(":") if part)
    # The centre's network interfaces (JUWELS's ib0) are the cluster's loopback; any other
    # name is left for gloo to refuse, as on the centre.
    for name in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
        if env.get(name) in CONFIG["compute"].get("interfaces", []):
            env[name] = "lo"
    os.execvpe(command[0], command, env)


def check_module(command: str) -> None:
    """Where the centre puts the runtime in a module (Alliance: `module load apptainer`),
    the command is not there until it is loaded: bash's message and status."""
    module = CONFIG["runtime"].get("module")
    if module and module not in os.environ.get("LOADEDMODULES", "").split(":"):
        fail(f"bash: {command}: command not found", 127)


def check_bound(command: list[str], binds: list[str]) -> None:
    """Apptainer's bind model: a site path the command names is in the container only
    under what Apptainer binds by default ($HOME, the current folder, /tmp, /var/tmp:
    https://apptainer.org/docs/user/latest/bind_paths_and_mounts.html), what the centre's
    configuration binds (the twin's runtime.binds, each cited) and the --bind folders (at
    their destination). Anything else is absent in the container."""
    # (/tmp and /var/tmp are the node's own: no site path is under them at the centre,
    # though the twin's folder is under the test machine's /tmp.)
    inside = [str(Path.home()), os.getcwd(),
              *(str(site_path(path)) for path in CONFIG["runtime"].get("binds", [])),
              *(bind.split(":")[1] if ":" in bind else bind.split(":")[0] for bind in binds)]
    for arg in command:
        path = arg.rpartition("=")[2]
        if not path.startswith(CONFIG["root_dir"] + "/"):
            continue
        if not any(path == top or path.startswith(top.rstrip("/") + "/") for top in inside):
            fail(f"twin: {path} is not in the container: Apptainer binds $HOME, the current "
                 f"folder ({os.getcwd()}), /tmp and the --bind folders, and none holds it "
                 "(bind it: apptainer exec --bind FOLDER ...); what the command writes "
                 "there would not reach the host", 255)


def apptainer_build(image: Path, recipe: Path, build_args: list[str]) -> None:
    """A build from a definition file with its --build-arg values (Apptainer 1.2+): a
    name neither given nor defaulted in %arguments is an error, and a local image as
    the base (Bootstrap: localimage) must exist and suit the node, as %post runs in it;
    %post's pip needs the internet."""
    check_network("apptainer build")
    if not recipe.is_file():
        fail(f"FATAL:   Unable to build from {recipe}: no such file or directory", 255)
    try:
        base = header(rendered(recipe, dict(arg.split("=", 1) for arg in build_args)))
    except KeyError as missing:
        fail(f"FATAL:   Unable to build from {recipe}: build var {missing.args[0]} is not "
             "defined through either --build-arg (--build-arg-file) or 'arguments' section",
             255)
    if base.get("bootstrap") == "localimage":
        check_arch(Path(base["from"]))
    write_image(image, GO_ARCH[node_arch()], str(recipe))


def check_login_node(command: str) -> None:
    """What the centre forbids on its login nodes (the twin's [login] forbids, cited) is
    refused there, naming the centre's rule; in a job it runs."""
    rule = CONFIG["login"].get("forbids", {}).get(command)
    if rule and not on_compute():
        fail(f"twin: {command} on a login node: this centre forbids it there ({rule})", 1)


def apptainer(args: list[str]) -> None:
    check_module("apptainer")
    check_login_node("apptainer")
    action, args = args[0], args[1:]
    flags, i = {}, 0
    while i < len(args) and args[i].startswith("-"):
        name = args[i].lstrip("-")
        if name in ("bind", "B", "arch", "env", "build-arg"):
            flags.setdefault(name, []).append(args[i + 1])
            i += 1
        i += 1
    args = args[i:]
    if action == "build":
        apptainer_build(Path(args[0]), Path(args[1]), flags.get("build-arg", []))
    elif action == "pull":
        check_network("apptainer pull")
        write_image(Path(args[0]), (flags.get("arch") or [GO_ARCH[node_arch()]])[-1], args[1])
    elif action in ("exec", "run"):
        image = Path(args[0])
        check_arch(image)
        binds = [b for spec in flags.get("bind", []) + flags.get("B", []) +
                 [os.environ.get("APPTAINER_BIND", "")] for b in spec.split(",") if b]
        for bind in binds:
            source = bind.split(":")[0]
            if not Path(source).exists():
                fail(f"FATAL:   container creation failed: mount hook function failure: "
                     f"mount {source}->{source} error: while mounting {source}: mount "
                     f"source {source} doesn't exist", 255)
        check_bound(args[1:], binds)
        # Apptainer passes the host's variables in but PATH and LD_LIBRARY_PATH; the
        # APPTAINERENV_ ones are set in the container ($LD_LIBRARY_PATH: the image's).
        env = {k: v for k, v in os.environ.items() if not k.startswith("APPTAINERENV_")}
        env |= {k.removeprefix("APPTAINERENV_"): v for k, v in os.environ.items()
                if k.startswith("APPTAINERENV_") and k != "APPTAINERENV_LD_LIBRARY_PATH"}
        library = os.environ.get("APPTAINERENV_LD_LIBRARY_PATH", "")
        run_in_image(args[1:], library.replace("$LD_LIBRARY_PATH", ""), env)
    else:
        fail(f"twin: apptainer {action}: not in the twin; add it to tests/helpers/twin_bin.py")


def podman_image(tag: str) -> Path:
    """Where podman keeps a local image: its store, or where the centre has its storage.conf
    point (CSCS: /dev/shm, a tmpfs of the node gone when the job ends, so a store of this
    job's own)."""
    store = Path(CONFIG["state"]) / "podman"
    if CONFIG["runtime"].get("podman_store"):
        store = Path(CONFIG["state"]) / f"dev-shm-of-job-{os.environ.get('SLURM_JOB_ID', 'none')}"
    store.mkdir(exist_ok=True)
    return store / tag.replace("/", "_")


def check_podman_storage() -> None:
    """Where the centre documents a storage.conf as podman's first step (CSCS: driver
    overlay, runroot and graphroot under /dev/shm/$USER), podman runs only with one there;
    the centre does not say what fails without it, so the twin refuses (strict)."""
    store = CONFIG["runtime"].get("podman_store")
    if not store:
        return
    config = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
    conf = config / "containers" / "storage.conf"
    storage = tomllib.loads(conf.read_text()).get("storage", {}) if conf.is_file() else {}
    roots = [storage.get(key, "").replace("$USER", os.environ["USER"])
             for key in ("runroot", "graphroot")]
    if not all(root.startswith(store + "/") for root in roots):
        fail(f"twin: podman: {conf} does not put runroot and graphroot under {store} (the "
             f"centre's first step for podman: {CONFIG['runtime']['podman_source']}); "
             "[twin: the centre does not say what fails without it: refused]", 125)


def podman(args: list[str]) -> None:
    check_podman_storage()
    if args[:1] == ["run"]:
        podman_run(args[1:])
    if args[:1] != ["build"] or "-t" not in args:
        fail(f"twin: podman {' '.join(args)}: the twin has `podman build -t TAG DIR` and "
             "`podman run [--rm] [-v SRC:DST]... TAG COMMAND...` only")
    check_network("podman build")  # the base image and pip's packages
    write_image(podman_image(args[args.index("-t") + 1]), GO_ARCH[node_arch()], args[-1],
                recipe_env(Path(args[-1])))


def podman_run(args: list[str]) -> None:
    """The local image's ENTRYPOINT (entrypoint.sh) runs the command; a volume's source
    must exist (podman's message)."""
    i = 0
    while args[i].startswith("-"):
        if args[i] in ("-v", "--volume"):
            source = args[i + 1].split(":")[0]
            if not Path(source).exists():
                fail(f"Error: statfs {source}: no such file or directory", 125)
            i += 1
        i += 1
    image = podman_image(args[i])
    if not image.is_file():
        fail(f"Error: {args[i]}: image not known", 125)
    check_arch(image)
    run_in_image(["entrypoint.sh", *args[i + 1:]], "", dict(os.environ))


def enroot(args: list[str]) -> None:
    flag = next((f for f in ("-o", "--output") if f in args), None)
    if args[0] != "import" or not flag:
        fail(f"twin: enroot {' '.join(args)}: the twin has `enroot import -o FILE URI` only")
    out, uri = Path(args[args.index(flag) + 1]), args[-1]
    if uri.startswith("podman://"):
        local = podman_image(uri.removeprefix("podman://"))
        if not local.is_file():
            fail(f"[ERROR] No such image: {uri.removeprefix('podman://')}")
        arch, env = (json.loads(local.read_text())[key] for key in ("arch", "env"))
    else:
        check_network("enroot import")  # docker://: from the registry
        arch, env = GO_ARCH[node_arch()], {}
    write_image(out, arch, uri, env)


def lfs(args: list[str]) -> None:
    """Lustre's `lfs setstripe ... DIR`: the folder must exist on a site file system."""
    if args[:1] != ["setstripe"]:
        fail(f"twin: lfs {' '.join(args)}: the twin has `lfs setstripe ... DIR` only")
    folder = Path(args[-1])
    if not folder.is_dir():
        fail(f"lfs setstripe: cannot create composite file '{folder}': No such file or "
             "directory", 2)
    if not any(str(folder).startswith(CONFIG["root_dir"] + root) for root in CONFIG["roots"]):
        fail(f"lfs setstripe: '{folder}' is not on a Lustre file system", 22)


def git(args: list[str]) -> None:
    """`git clone` of this project: its files, as links to this checkout."""
    if args[:1] != ["clone"] or args[1] != CONFIG["project_url"]:
        fail(f"twin: git {' '.join(args)}: the twin clones {CONFIG['project_url']} only")
    check_network("git clone")
    target = Path(args[2] if len(args) > 2 else Path(args[1]).name)
    target.mkdir()
    for entry in Path(CONFIG["repo"]).iterdir():
        if entry.name not in (".git", "runs", "data"):
            (target / entry.name).symlink_to(entry)
    print(f"Cloning into '{target}'...")


# ------------------------------------------------------------------ CSCS's Container Engine
def find_edf(name: str) -> Path:
    """--environment: a path (with a '/'), or NAME.toml in $HOME/.edf (CSCS's run page).
    A missing one is an error before any task starts; the CE's own wording is NOT
    CONFIRMED here, so the message names the file and the option."""
    path = Path(name) if "/" in name else Path.home() / CONFIG["edf_folder"] / f"{name}.toml"
    if not path.is_file():
        fail(f"srun: error: container-engine: the environment definition file {path} "
             f"(--environment={name}) does not exist")
    return path.resolve()


# The CE's expansion (the EDF reference, "Environment variable expansion":
# https://docs.cscs.ch/software/container-engine/edf/, read 2026-12-05 in its source,
# eth-cscs/cscs-docs docs/software/container-engine/edf.md as of 2026-08-20): ${VAR} in
# every EDF parameter, from the host's variables and the image's, "the later taking
# precedence"; an undefined one "results in an error", ${VAR:-} is empty then; $${VAR}
# is the literal ${VAR}.
EDF_VARIABLE = re.compile(r"\$(\$?)\{(\w+)(:-)?\}")


def expanded(value, variables: dict[str, str], edf: str):
    """The EDF's value with its ${VAR} expanded as the CE does (EDF_VARIABLE); an undefined
    one stops the step, naming it (the CE's wording is NOT CONFIRMED)."""
    if isinstance(value, dict):
        return {key: expanded(item, variables, edf) for key, item in value.items()}
    if isinstance(value, list):
        return [expanded(item, variables, edf) for item in value]
    if not isinstance(value, str):
        return value

    def one(found: re.Match) -> str:
        escaped, name, empty_if_unset = found.groups()
        if escaped:
            return found.group(0)[1:]
        if name not in variables and not empty_if_unset:
            fail(f"error: container-engine: {edf}: ${{{name}}} is not defined (the CE refuses "
                 "an undefined variable; ${VAR:-} for an empty one) [twin: the CE's wording "
                 "is NOT CONFIRMED]")
        return variables.get(name, "")
    return EDF_VARIABLE.sub(one, value)


def ce_task(args: list[str]) -> None:
    """In the step, on the node: the EDF's image, mounts, workdir and env."""
    raw = tomllib.loads(Path(args[0]).read_text())
    # The image's own name knows the host's variables only; the rest knows the image's too.
    image_name = expanded(raw["image"], dict(os.environ), args[0])
    image = site_path(image_name)
    if not image.is_file():
        fail(f"error: container-engine: the EDF's image {image_name} ({args[0]}) does not "
             "exist [twin: the CE's wording is NOT CONFIRMED]")
    check_arch(image)
    image_env = json.loads(image.read_text()).get("env", {})
    edf = expanded(raw, dict(os.environ) | image_env, args[0])
    for mount in edf.get("mounts", []):
        source = mount.split(":")[0]
        if not site_path(source).exists():
            fail(f"error: container-engine: mount source {source} does not exist")
    # The image's variables win over the host's (the CE is a customised pyxis, with
    # pyxis's rule; the EDF reference's [env]: "Inherited from the host and the image by
    # default"), the EDF's env over both (the EDF reference).
    env = pyxis_env({}, image_env, args[2:], "set it in the EDF's [env]") | {
        k: str(v) for k, v in edf.get("env", {}).items()}
    if "workdir" in edf:
        os.chdir(site_path(edf["workdir"]))
    if edf.get("entrypoint"):
        env |= ce_entrypoint(edf, env, " ".join(args[2:5]))
    run_in_image(args[2:], "", env)


# What pyxis keeps from the job for the container's start (enroot_deny_env): the
# per-task variables are not there yet, once a node.
START_DENIED = ("PATH", "LD_LIBRARY_PATH", "LD_PRELOAD", "SLURM_PROCID", "SLURM_LOCALID",
                "SLURM_TASK_PID", "PMIX_RANK", "PMI_FD")


def ce_entrypoint(edf: dict, env: dict[str, str], step: str) -> dict[str, str]:
    """The EDF's `entrypoint = true`: "run the entrypoint from the container image" (the
    EDF reference, default false). The CE is a customised pyxis (the run page, "Differences
    from upstream Pyxis", both read 2026-11-29), and pyxis runs the entrypoint once a node
    when it starts the container, as `ENTRYPOINT sh -c 'kill -STOP $$'`, with the job's
    variables but START_DENIED; every task then takes the environment that process was
    left with, over its own (pyxis_slurmstepd.c: enroot_start_once,
    spank_import_container_env). The entrypoint's output is hidden unless the EDF's
    annotation com.pyxis.entrypoint_log is "true" (the run page); a failing one stops the
    step with pyxis's messages. A per-task variable it set (RANK, LOCAL_RANK: the same on
    every task of the node) that is not this task's is recorded for the site test."""
    import subprocess
    start = {k: v for k, v in env.items() if k not in START_DENIED}
    done = subprocess.run(["entrypoint.sh", "sh", "-c", "env -0"], capture_output=True,
                          text=True, env=start | {"PATH": CONFIG["image_path"]})
    if done.returncode:
        fail(f"{done.stderr}slurmstepd: error: pyxis: container start failed with error code: "
             f"{done.returncode}\nslurmstepd: error: pyxis: if the image has an unusual "
             "entrypoint, try using --no-container-entrypoint")
    # The annotation as TOML reads it: dotted keys are nested tables, a quoted key is one.
    annotations = edf.get("annotations", {})
    if annotations.get("com.pyxis.entrypoint_log", annotations.get("com", {}).get(
            "pyxis", {}).get("entrypoint_log")) == "true":
        sys.stderr.write(done.stderr)  # (its stdout here is the environment it left)
    left = dict(item.split("=", 1) for item in done.stdout.split("\0") if "=" in item)
    left.pop("PATH", None)
    wrong = {name: left[name] for name, own in (("RANK", "SLURM_PROCID"),
                                                ("LOCAL_RANK", "SLURM_LOCALID"))
             if name in left and left[name] != env.get(own, left[name])}
    if wrong:
        record({"step": step, "entrypoint_sets": wrong,
                "task": {own: env.get(own) for own in ("SLURM_PROCID", "SLURM_LOCALID")}})
    return left


# ------------------------------------------------------------------ pyxis (srun --container-*)
def pyxis_task(args: list[str]) -> None:
    """In the step, on the node: the squashfs image (its architecture checked), the
    mounts (each source must exist), the workdir; the command runs without the image's
    ENTRYPOINT (pyxis's default). A host path the command names that no mount brings in
    does not exist in the container: refused, as the task would fail to find it. The
    exact pyxis/enroot wording is NOT CONFIRMED here: the messages name the path."""
    options = json.loads(args[0])
    image = Path(options["container-image"])
    if not image.is_file():
        fail(f"slurmstepd: error: pyxis: [ERROR] No such file or directory: {image}")
    if image_arch(image) != GO_ARCH[node_arch()]:
        fail(f"slurmstepd: error: pyxis: {args[2]}: exec format error (an "
             f"{image_arch(image)} image on an {GO_ARCH[node_arch()]} node)")
    # --container-mounts=SRC[:DST[:FLAGS]],... (pyxis's README): DST is SRC where not given.
    listed = [m.split(":") for m in (options.get("container-mounts") or "").split(",") if m]
    for source, *_ in listed:
        if not Path(source).exists():
            fail(f"slurmstepd: error: pyxis: [ERROR] No such file or directory: {source}")
    mounts = [parts[1] if len(parts) > 1 else parts[0] for parts in listed]
    # The site's file systems are not in the container but where mounted; the image's
    # WORKDIR (/workspace) is a folder of the twin's, thrown away with the container.
    workdir = options.get("container-workdir")
    named = [arg for arg in args[2:] if arg.startswith(CONFIG["root_dir"])]
    for path in ([workdir] if workdir else []) + named:
        if not any(path == m or path.startswith(m.rstrip("/") + "/") for m in mounts):
            fail(f"pyxis twin: {path}: No such file or directory in the container (not "
                 "under --container-mounts)")
    if not workdir and trains(args[2:]):
        record({"step": " ".join(args[2:5]), "pyxis_workdir": "the image's"})
    inside = Path(CONFIG["state"]) / "workspace"
    inside.mkdir(exist_ok=True)
    os.chdir(workdir or inside)
    run_in_image(args[2:], "", pyxis_env(options, json.loads(image.read_text())["env"], args[2:]))


def pyxis_env(options: dict, image_env: dict[str, str], command: list[str],
              fix: str = "name it in --container-env") -> dict[str, str]:
    """pyxis's environment rule (its README, --container-env): the host's exported
    variables are set in the container, but a value the image sets takes precedence, but
    for the names --container-env gives. A host value the image overrides is recorded:
    the page relied on a variable the container never sees."""
    kept = set(filter(None, (options.get("container-env") or "").split(",")))
    env = dict(os.environ)
    for name, value in image_env.items():
        if name in kept and name in env:
            continue
        if env.get(name) not in (None, value):
            record({"step": " ".join(command[:3]), "image_wins": name, "host": env[name],
                    "image": value, "fix": fix})
        env[name] = value
    return env


# ------------------------------------------------------------------ NERSC's Shifter
def shifter_image(name: str) -> Path:
    store = Path(CONFIG["state"]) / "shifter"
    store.mkdir(exist_ok=True)
    return store / name.replace("/", "_")


def shifterimg(args: list[str]) -> None:
    """`shifterimg pull NAME`: from the twin's registry (what the user pushed), into
    Shifter's image store. The wording of Shifter's errors is NOT CONFIRMED here: the
    messages name the image."""
    if args[:1] != ["pull"] or len(args) != 2:
        fail(f"twin: shifterimg {' '.join(args)}: the twin has `shifterimg pull NAME` only")
    registry = {name.format(user=os.environ["USER"]): arch
                for name, arch in CONFIG["runtime"].get("registry", {}).items()}
    if args[1] not in registry:
        fail(f"shifterimg: ERROR: failed to pull {args[1]}: the image does not exist in "
             "the registry", 1)
    write_image(shifter_image(args[1]), registry[args[1]], args[1])


def shifter(args: list[str]) -> None:
    """`shifter [--image=NAME] [-V SRC:DST]... COMMAND`: the image (else the job's sbatch
    --image) must have been pulled and be of the node's architecture; a volume's source
    must exist, and the command's paths under DST are SRC on the host."""
    name, volumes, i = os.environ.get("TWIN_SHIFTER_IMAGE"), [], 0
    while args[i].startswith("-"):
        if args[i].startswith("--image="):
            name = args[i].split("=", 1)[1]
        elif args[i] in ("-V", "--volume"):
            volumes.append(args[i + 1])
            i += 1
        i += 1
    if not name or not shifter_image(name).is_file():
        fail(f"shifter: ERROR: image {name or '(none: no --image)'} not found: pull it first "
             "(shifterimg pull)")
    if image_arch(shifter_image(name)) != GO_ARCH[node_arch()]:
        fail(f"shifter: {args[i]}: exec format error (an {image_arch(shifter_image(name))} "
             f"image on an {GO_ARCH[node_arch()]} node)")
    command = args[i:]
    for volume in volumes:
        source, target = volume.split(":")[:2]
        if not Path(source).is_dir():
            fail(f"shifter: ERROR: volume source {source} (-V {volume}): No such file or "
                 "directory")
        command = [source + arg[len(target):] if arg == target or arg.startswith(target + "/")
                   else arg for arg in command]
    run_in_image(command, "", dict(os.environ))


COMMANDS = {"srun": srun, "sbatch": sbatch, "apptainer": apptainer, "podman": podman,
            "enroot": enroot, "git": git, "lfs": lfs, "ce-task": ce_task, "pyxis-task": pyxis_task,
            "shifter": shifter, "shifterimg": shifterimg}

if __name__ == "__main__":
    COMMANDS[sys.argv[1]](sys.argv[2:])
