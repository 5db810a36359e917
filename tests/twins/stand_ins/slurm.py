"""srun and sbatch: a request checked against the centre's nodes and partitions, then
asked of the cluster at its scale (the package's docstring says how)."""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

from tests.twins.stand_ins import STAND_IN
from tests.twins.stand_ins.container_engine import find_edf
from tests.twins.stand_ins.node import CONFIG, fail, on_compute
from tests.twins.stand_ins.requests import record, trains

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
                     "tests/twins/stand_ins/slurm.py")
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
    # account, its QOS and their limits: tests/twins/twin.py), as are the input variables that give
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
        command = [*STAND_IN, "ce-task", str(find_edf(options["environment"])),
                   "--", *command]
    if options.get("container-image"):
        command = [*STAND_IN, "pyxis-task", json.dumps(options), "--", *command]
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
        if "@" in (options.get("signal") or ""):  # and its signal before the limit too
            options["time"], lead = os.environ["TWIN_SIGNALLED_LIMIT"].split("@")
            options["signal"] = f"{options['signal'].rsplit('@', 1)[0]}@{lead}"
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
