"""The srun command of a job script: the step for a layout, a runtime and a site.

jobs/lib/launch.sh runs this file on the batch host, where the image's Python is not
there: it needs any python3 (3.6 or later) and the standard library only, and imports
nothing else of this package. `python -m workload.launch jobs DEST` copies it into
DEST/lib/ beside launch.sh; in a source checkout launch.sh finds it here.

    python3 jobstep.py --jobs-dir DIR train [train arguments...]
    python3 jobstep.py --jobs-dir DIR script [script arguments...]   # SCRIPT, FORM
    python3 jobstep.py --jobs-dir DIR decide train|script [arguments...]
    python3 jobstep.py --jobs-dir DIR preflight [train arguments...]  # doctor, PREFLIGHT=1

`decide` prints the command of the decision after a step (`diagnose RUN_DIR`, run in the
image as the step is; docs/failures.md), or nothing where the run folder is not known (a
user's script without TRAIN_RUN_DIR). STEP_NODES (node names, comma-separated) puts the
step on those nodes of the allocation: the job script sets it when it keeps spare nodes
or the decision moved the step (a restart on a spare, a shrink).

The job scripts ask one task per node holding the node's GPUs (--gpus-per-node) and
the CPUs its header or the sbatch line gives (--cpus-per-task: not always the whole
node's; docs/sites/ says how many each centre gives a GPU), and the step is shaped from
that, so
`sbatch --nodes=4 --gpus-per-node=2 jobs/X.sbatch` needs nothing else. In the per-task
layout every task sees the node's GPUs and train takes GPU LOCAL_RANK (GPUs visible to
each other keep NCCL's peer-to-peer paths, which per-task GPU cgroups can cut). Per-task
is the default because train resolves rank, GPU and rendezvous from SLURM's own
variables, so srun alone starts it: no entrypoint, no second launcher, and one task per
process for srun to signal, account and kill. torchrun is there for sites and habits that
want it (the Olivia guide's way).

The settings come from the environment (the table in jobs/lib/launch.sh's header). The
command goes to stdout as NUL-terminated arguments, which the shell reads into one array
(`mapfile -d ''`): no argument is ever re-split or evaluated. A bad setting is one line
on stderr, naming it and its fix, and exit status 2 before anything runs.
"""

import argparse
import os
import re
import sys

LAYOUTS = ("per-task", "torchrun")
RUNTIMES = ("apptainer", "docker", "none", "pyxis", "edf")
# A user's script in FORM runs in the step shape of this layout.
FORM_LAYOUTS = {"per-task": "per-task", "torchrun": "torchrun", "no-entrypoint": "per-task"}
# The one train command of the job scripts; the output folder stays the same across
# requeues (a requeued job keeps its id) and chains (TRAIN_RUN_ID, run_id).
TRAIN_SETTINGS = ("--batch-size", "256", "--epochs", "100", "--base-lr", "0.01",
                  "--target-accuracy", "0.95", "--patience", "2")
# torchrun dies of USR2 unless told to handle it; then it passes it on to its workers,
# which checkpoint (jobs/lib/requeue.sh, train, workload.launch.preemption).
TORCHRUN_SIGNALS = "--signals-to-handle=SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR2"
# `scancel --signal=USR1` (docs/hangs.md) reaches every process of the step; train dumps
# its stacks, torchrun dies of it and stops its workers on any signal it handles. So the
# step starts with USR1 ignored, which exec and fork pass on; train's handler replaces it.
IGNORE_USR1 = ["bash", "-c", 'trap "" USR1 && exec "$@"', "ignore-usr1"]
# What a docker container needs from the task (apptainer passes the environment on).
# `docker run -e NAME` takes NAME's value from the docker client: the task's own value.
DOCKER_PASSES = (
    "SLURM_JOB_ID", "SLURM_JOBID", "SLURM_STEP_ID", "SLURM_STEPID", "SLURM_PROCID",
    "SLURM_LOCALID", "SLURM_NODEID", "SLURM_NTASKS", "SLURM_NPROCS", "SLURM_NNODES",
    "SLURM_STEP_NUM_TASKS", "SLURM_STEP_NUM_NODES", "SLURM_STEP_NODELIST",
    "SLURM_JOB_NODELIST", "SLURM_NODELIST", "SLURM_STEP_TASKS_PER_NODE",
    "SLURM_TASKS_PER_NODE", "SLURM_CPUS_PER_TASK", "SLURM_JOB_NODELIST_HET_GROUP_0",
    "CUDA_VISIBLE_DEVICES", "MASTER_ADDR", "MASTER_PORT", "OMP_NUM_THREADS",
    "TRAIN_REQUEUE_FILE", "TRAIN_PREVIOUS_STEP_ENDED")
# The option each runtime mounts DATA_DIR (and the job's folder) with, and the characters
# it splits mounts on (--bind src[:dest[:opts]][,...], -v src:dest, the same for pyxis).
MOUNT_SYNTAX = {"apptainer": ("--bind", ",:"), "docker": ("-v", ":"),
                "pyxis": ("--container-mounts", ",:")}
PRESET_EXPORT = re.compile(r"^export ([A-Za-z_][A-Za-z0-9_]*)=", re.M)
NODE_NAMES = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}(,[A-Za-z0-9][A-Za-z0-9._-]{0,62})*")


class JobError(Exception):
    """A setting the job cannot run with; the message names it and the fix."""


def setting(env, name, default=""):
    """NAME's value, or `default` when it is unset or empty (as ${NAME:-default})."""
    return env.get(name) or default


def shown(value):
    """A value as an error line shows it: escaped, and cut short if long."""
    text = repr(value)[1:-1]
    return text if len(text) <= 200 else text[:200] + "..."


def whole(name, value, what, fix=""):
    """VALUE of NAME as a whole number from 1 to 99999 (a node, CPU or GPU count)."""
    if not re.fullmatch(r"[1-9][0-9]{0,4}", value):
        raise JobError("{}={}: expected a whole number of {}, such as 4{}"
                       .format(name, shown(value), what, fix))
    return int(value)


def plain_path(name, value, runtime=None):
    """VALUE of the path setting NAME, refused where its command would misread it: a
    leading '-' as an option; ',' and ':' where RUNTIME mounts it, as another mount."""
    if re.search(r"[\x00-\x1f\x7f]", value):
        raise JobError("{}={}: holds a control character; remove it".format(name, shown(value)))
    option, separators = MOUNT_SYNTAX.get(runtime, ("", ""))
    bad = [repr(char) for char in separators if char in value]
    if bad:
        raise JobError("{}={}: holds {}, which {}'s {} reads as a separator between "
                       "mounts or fields; use a path without {} (a link to it will do)"
                       .format(name, shown(value), " and ".join(bad), runtime, option,
                               " or ".join(repr(char) for char in separators)))
    if value.startswith("-"):
        raise JobError("{}={}: starts with '-', which the command it goes into reads as "
                       "an option; name it by a path such as ./{}"
                       .format(name, shown(value), shown(value)))
    return value


def folders(env, runtime=None):
    """(cwd, DATA_DIR) as the step sees them: DATA_DIR made absolute, as the runtimes
    mount it at the same path (docker would take a relative one for a volume's name)."""
    cwd = plain_path("PWD", setting(env, "PWD", os.getcwd()),
                     runtime if runtime in ("docker", "pyxis") else None)
    data_dir = os.path.join(cwd, setting(env, "DATA_DIR", "data"))
    return cwd, plain_path("DATA_DIR", os.path.normpath(data_dir), runtime)


def gpus_per_node(env):
    """GPUS_PER_NODE, else the job's --gpus-per-node (a typed `h100:4` gives 4), else 1."""
    value = setting(env, "GPUS_PER_NODE", setting(env, "SLURM_GPUS_PER_NODE", "1"))
    return whole("GPUS_PER_NODE", value.rsplit(":", 1)[-1], "GPUs")


def check_one_task_per_node(env):
    tasks = setting(env, "SLURM_NTASKS_PER_NODE", "1")
    if tasks != "1":
        raise JobError("--ntasks-per-node={}: the job scripts ask one task per node and "
                       "start GPUS_PER_NODE processes per node themselves; set "
                       "--gpus-per-node (or GPUS_PER_NODE) instead".format(shown(tasks)))


def preset_names(env, jobs_dir):
    """The variables the sourced PRESET exports (read from its file, never run here)."""
    preset = setting(env, "PRESET")
    if not preset:
        return []
    path = os.path.join(jobs_dir, "presets", preset + ".sh")
    try:
        with open(path, encoding="utf-8", errors="replace") as file:  # names are ASCII
            return PRESET_EXPORT.findall(file.read())
    except OSError as error:
        raise JobError("PRESET={}: cannot read {} ({}); choose one of jobs/presets"
                       .format(shown(preset), path, error.strerror)) from None


def runtime_commands(env, jobs_dir, names):
    """(in_step, in_image, via_entrypoint) for RUNTIME: srun options that put the step in
    a container; how a task runs a command in the image as it is (train resolves SLURM by
    itself); how it runs one through entrypoint.sh (torchrun, a user's script)."""
    runtime = setting(env, "RUNTIME", "apptainer")
    if runtime not in RUNTIMES:
        raise JobError("RUNTIME={}: expected {} or {}".format(
            shown(runtime), ", ".join(RUNTIMES[:-1]), RUNTIMES[-1]))
    cwd, data_dir = folders(env, runtime)
    image = plain_path("IMAGE", setting(env, "IMAGE", os.path.join(cwd, "hpc-train.sif")))
    entrypoint = plain_path("ENTRYPOINT", setting(env, "ENTRYPOINT", "entrypoint.sh"))
    if runtime == "apptainer":
        in_image = ["apptainer", "exec", "--nv", "--bind", data_dir, image]
        return [], in_image, in_image + [entrypoint]
    if runtime == "docker":
        # docker run runs the image's ENTRYPOINT by itself. Host network and IPC for the
        # rendezvous and NCCL's shared memory; all GPUs, narrowed by CUDA_VISIBLE_DEVICES.
        passes = [arg for name in names for arg in ("-e", name)]
        in_image = ["docker", "run", "--rm", "--gpus", "all", "--network", "host", "--ipc",
                    "host", "--ulimit", "memlock=-1", "--ulimit", "stack=67108864", "-v",
                    data_dir + ":" + data_dir, "-v", cwd + ":" + cwd, "-w", cwd] + passes
        return [], in_image + [image], in_image + [image]
    if runtime == "none":
        return [], [], [os.path.join(jobs_dir, "..", "entrypoint.sh")]
    if runtime == "pyxis":
        # pyxis starts in the image's WORKDIR and skips its ENTRYPOINT: start in this
        # folder (mounted at the same path) so relative paths stay on the host. enroot
        # gives the container its own /tmp: the job's node-local folder, where SLURM
        # gives one, is mounted too, for the caches and --stage-to (workload/caches.py).
        mounts = [cwd, data_dir]
        if setting(env, "SLURM_TMPDIR"):
            mounts.append(plain_path("SLURM_TMPDIR", env["SLURM_TMPDIR"], runtime))
        return (["--container-image=" + image, "--container-mounts=" + ",".join(mounts),
                 "--container-workdir=" + cwd], [], [entrypoint])
    edf = setting(env, "EDF")
    if not edf:
        raise JobError("RUNTIME=edf needs EDF, e.g. EDF=$PWD/jobs/sites/cscs-alps.toml")
    # The EDF names the image, the mounts and the working folder (and the NCCL hook).
    return ["--environment=" + plain_path("EDF", edf)], [], [entrypoint]


def step_nodes(env):
    """STEP_NODES as a list of node names ([]: srun takes the allocation's nodes)."""
    value = setting(env, "STEP_NODES")
    if value and not NODE_NAMES.fullmatch(value):
        raise JobError("STEP_NODES={}: expected node names separated by commas, such as "
                       "nid001,nid003".format(shown(value)))
    return value.split(",") if value else []


def node_options(env):
    """srun's --nodes and --nodelist for STEP_NODES (none without it)."""
    nodes = step_nodes(env)
    return ["--nodes={}".format(len(nodes)), "--nodelist=" + ",".join(nodes)] if nodes else []


def task_shape(env, layout, gpus):
    """srun's task options for LAYOUT from the job's one task per node (on STEP_NODES
    where it is set): --cpus-per-task given explicitly, as Slurm 22.05-23.02 srun does
    not inherit it from sbatch."""
    nodes = len(step_nodes(env)) or whole("SLURM_NNODES", setting(env, "SLURM_NNODES", "1"),
                                          "nodes", "; sbatch sets it from --nodes")
    node_cpus = setting(env, "SLURM_CPUS_PER_TASK")
    node_cpus = node_cpus and whole("SLURM_CPUS_PER_TASK", node_cpus, "CPUs",
                                    "; sbatch sets it from --cpus-per-task")
    if layout == "torchrun":
        shape = ["--ntasks={}".format(nodes), "--ntasks-per-node=1"]
        return shape + (["--cpus-per-task={}".format(node_cpus)] if node_cpus else [])
    shape = ["--ntasks={}".format(nodes * gpus), "--ntasks-per-node={}".format(gpus)]
    if not node_cpus:
        return shape
    if node_cpus < gpus:
        raise JobError("--cpus-per-task={} cannot be split among GPUS_PER_NODE={} tasks: ask "
                       "for at least one CPU per GPU (sbatch --cpus-per-task)"
                       .format(node_cpus, gpus))
    return shape + ["--cpus-per-task={}".format(node_cpus // gpus)]


def check_command(layout, in_image):
    torchrun = ["--command", "torchrun"] if layout == "torchrun" else []
    return in_image + ["python", "-m", "workload.launch", "check"] + torchrun


def run_id(env):
    """The run's folder name: TRAIN_RUN_ID, the first job of a chain (jobs/lib/requeue.sh
    passes it on), else this job's id, which a requeued job keeps."""
    job_id = setting(env, "SLURM_JOB_ID")
    if not job_id:
        raise JobError("SLURM_JOB_ID is not set: run the job scripts with sbatch")
    value = setting(env, "TRAIN_RUN_ID", job_id)
    if not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]*", value):
        raise JobError("TRAIN_RUN_ID={}: expected a job id such as 12345".format(shown(value)))
    return value


def train_command(env, args):
    data_dir = folders(env)[1]
    return (["train", "--dataset", "cifar100", "--data-dir", data_dir] + list(TRAIN_SETTINGS)
            + ["--output-dir", "runs/" + run_id(env)] + list(args))


def doctor_command(env, args):
    """doctor's preflight (PREFLIGHT=1) of train's step: the output folder train will
    write to, its JSON report where jobs/lib/requeue.sh reads it (TRAIN_PREFLIGHT_REPORT),
    and PREFLIGHT_ARGS (doctor's flags, split at spaces)."""
    report = plain_path("TRAIN_PREFLIGHT_REPORT", setting(env, "TRAIN_PREFLIGHT_REPORT"))
    return (["doctor", "--output-dir", output_dir(args) or "runs/" + run_id(env), "--json",
             report] + setting(env, "PREFLIGHT_ARGS").split())


def layout_of(env, what):
    """The step's layout: LAYOUT for train, FORM's shape for a user's script."""
    if what == "script":
        if not setting(env, "SCRIPT"):
            raise JobError("SCRIPT is not set: name your training script, e.g. "
                           "SCRIPT=my_train.py sbatch jobs/own-script.sbatch")
        form = setting(env, "FORM", "per-task")
        if form not in FORM_LAYOUTS:
            raise JobError("FORM={}: expected per-task, torchrun or no-entrypoint"
                           .format(shown(form)))
        return FORM_LAYOUTS[form]
    layout = setting(env, "LAYOUT")  # its default is in jobs/lib/launch.sh
    if layout not in LAYOUTS:
        raise JobError("LAYOUT={}: expected per-task or torchrun".format(shown(layout)))
    return layout


def step_command(env, jobs_dir, what, args):
    """The whole srun command line of the job's step (see the module's docstring)."""
    layout = layout_of(env, what)
    gpus = gpus_per_node(env)
    check_one_task_per_node(env)
    names = preset_names(env, jobs_dir)
    in_step, in_image, via_entrypoint = runtime_commands(env, jobs_dir,
                                                         list(DOCKER_PASSES) + names)
    via_entrypoint[len(in_image):len(in_image)] = IGNORE_USR1  # the image's command starts
    in_image = in_image + IGNORE_USR1  # with USR1 ignored
    torchrun = ["torchrun", "--nproc-per-node={}".format(gpus), TORCHRUN_SIGNALS]
    if what in ("train", "preflight"):
        train = train_command(env, args) if what == "train" else doctor_command(env, args)
        command = (via_entrypoint + torchrun + ["--no-python"] + train
                   if layout == "torchrun" else in_image + train)
    else:
        command = script_command(env, in_image, via_entrypoint, torchrun, args)
    if setting(env, "LAUNCH_CHECK"):
        command = check_command(layout, in_image)
    # --kill-on-bad-exit=1: one failed rank ends the step.
    return (["srun", "--kill-on-bad-exit=1"] + node_options(env) + in_step
            + task_shape(env, layout, gpus) + command)


def output_dir(args):
    """The last --output-dir of train's arguments (argparse takes the last), or None."""
    found = None
    for index, arg in enumerate(args):
        if arg == "--output-dir" and index + 1 < len(args):
            found = args[index + 1]
        elif arg.startswith("--output-dir="):
            found = arg.split("=", 1)[1]
    return found


def decide_command(env, jobs_dir, what, args):
    """`diagnose RUN_DIR` where the step's image runs it ([] without a known run folder):
    the batch shell passes it the step's ending and runs what it decides."""
    run_dir = setting(env, "TRAIN_RUN_DIR")
    if not run_dir and what == "train":
        run_dir = output_dir(args) or "runs/" + run_id(env)
    if not run_dir:
        return []
    in_step, in_image, _ = runtime_commands(env, jobs_dir, list(DOCKER_PASSES))
    if in_step:  # pyxis, edf: the image only inside a step, of one task on this node
        node = setting(env, "SLURMD_NODENAME")
        in_image = (["srun", "--overlap", "--nodes=1", "--ntasks=1", "--cpus-per-task=1"]
                    + (["--nodelist=" + node] if node else []) + in_step)
    return in_image + ["diagnose", plain_path("TRAIN_RUN_DIR", run_dir)]


def script_command(env, in_image, via_entrypoint, torchrun, args):
    """A user's SCRIPT in FORM: through entrypoint.sh (per-task), under torchrun, or as
    is when the script calls workload.launch.setup() itself (no-entrypoint)."""
    script = plain_path("SCRIPT", setting(env, "SCRIPT"))
    python = plain_path("PYTHON", setting(env, "PYTHON", "python"))
    form = setting(env, "FORM", "per-task")
    if form == "torchrun":
        return via_entrypoint + torchrun + [script] + list(args)
    runner = via_entrypoint if form == "per-task" else in_image
    return runner + [python, script] + list(args)


def report_preset(env, jobs_dir):
    """Into the job log: what the preset set (the shell sourced it before this ran)."""
    for name in preset_names(env, jobs_dir):
        sys.stderr.write("preset {}: {}={}\n".format(env["PRESET"], name, env.get(name, "")))


def main(argv=None):
    parser = argparse.ArgumentParser(prog="jobstep.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs-dir", required=True, help="the jobs/ folder (its presets)")
    parser.add_argument("what", choices=("train", "script", "decide", "preflight"))
    parser.add_argument("args", nargs=argparse.REMAINDER)
    options = parser.parse_args(argv)
    args = options.args[1:] if options.args[:1] == ["--"] else options.args
    deciding = options.what == "decide"
    what = args.pop(0) if deciding and args[:1] in (["train"], ["script"]) else options.what
    args = args[1:] if args[:1] == ["--"] else args
    try:
        if deciding:
            command = decide_command(os.environ, options.jobs_dir, what, args)
        else:
            command = step_command(os.environ, options.jobs_dir, what, args)
    except JobError as exc:
        sys.stderr.write("job: {}\n".format(exc))
        return 2
    if not deciding:
        report_preset(os.environ, options.jobs_dir)
    sys.stdout.write("".join(arg + "\0" for arg in command))
    return 0


if __name__ == "__main__":
    sys.exit(main())
