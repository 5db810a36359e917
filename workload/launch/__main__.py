"""Print or check the launch resolution for this process.

    python -m workload.launch env            # KEY=VALUE lines a shell can source
    python -m workload.launch env --command torchrun   # for a torchrun about to start
    python -m workload.launch check          # explain layout mistakes and their fixes
    python -m workload.launch jobs [DEST]    # copy the job scripts out (default ./jobs)
    python -m workload.launch nccl [--module NCCL/X.Y.Z-...]...   # bound libnccl new enough?

Inside a job step, for example:
    srun -N2 --ntasks-per-node=4 python -m workload.launch check
    srun -N2 --ntasks-per-node=1 apptainer exec --nv image.sif python -m workload.launch env

Exit status: 0 fine, 1 layout problems found (check), 2 a bad value (nothing started; for
nccl: the libnccl on LD_LIBRARY_PATH is older than the one torch was built with).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path
from collections.abc import Mapping

from workload.caches import CACHE_KEYS, ROOT_VARIABLE, use_private_caches
from workload.commands import ENDING_SIGNALS, add_version_argument
from workload.errors import LaunchError, failed_write_line
from workload.launch.devices import GPU_VARIABLE, visible_gpu_count
from workload.launch import nccl
from workload.launch.preemption import signals_from_the_start
from workload.launch.diagnostics import FLIGHT_RECORDER_KEYS, apply_defaults, user_folder
from workload.launch.jobs import copy_jobs, find_jobs, submit_command
from workload.launch.resolve import (DIST_KEYS, NO_ADDRESS, NO_SHARED_STORE, PER_TASK,
                                     PET_KEYS, TORCHRUN, Resolution, resolve,
                                     resolve_for_torchrun)
from workload.logs import say, warn

TORCHRUN_COMMANDS = {"torchrun", "torch.distributed.run"}
# Commands of this package that pick their GPU from the resolution themselves: the
# LOCAL_RANK pitfall note is for other programs (a user's own script).
OWN_COMMANDS = {"train", "bench", "doctor"}
# Every variable `env` may print: entrypoint.sh exports these and no other (its
# EXPORTED_KEYS, which tests/unit/test_launch_env.py holds equal to this list).
EXPORTED_KEYS = (*DIST_KEYS, "OMP_NUM_THREADS", GPU_VARIABLE, *PET_KEYS, *NO_SHARED_STORE,
                 *FLIGHT_RECORDER_KEYS, *CACHE_KEYS)
# A control character (a newline above all) would split a value into a second line.
CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def is_torchrun(command: str | None) -> bool:
    return bool(command) and Path(command).name in TORCHRUN_COMMANDS


def resolve_for(command: str | None, env: Mapping[str, str]) -> Resolution:
    if is_torchrun(command):
        return resolve_for_torchrun(env)
    return resolve(env, visible_gpus=visible_gpu_count(env))


def render_env(res: Resolution) -> str:
    lines = [f"# layout: {res.layout}"]
    if res.gpu_index is not None:
        lines.append(f"# gpu: cuda:{res.gpu_index}")
    if res.cpus is not None:
        lines.append(f"# cpus: {res.cpus}")
    lines += [env_line(key, value) for key, value in res.values.items()]
    return "\n".join(lines) + "\n"


def env_line(key: str, value: str) -> str:
    """One KEY=VALUE line for a shell to export: a key of EXPORTED_KEYS, a value of one
    line without control characters (a newline in a folder's name would add a line,
    PATH=... for one)."""
    if key not in EXPORTED_KEYS:
        raise ValueError(f"{key} is not in EXPORTED_KEYS: add it there and to entrypoint.sh")
    if CONTROL.search(value):
        raise LaunchError(key, value, "a value without control characters (newline, tab, "
                          "escape)", f"start from a folder whose path has none, or set "
                          f"{key} to such a path")
    return f"{key}={value}"


# ------------------------------------------------------------------ layout checks (check)
def _gpu_problems(res: Resolution, tasks_on_node: int) -> list[str]:
    visible = int(res.notes.get("visible_gpus", "0"))
    if visible <= 1 or tasks_on_node == visible:
        return []
    if tasks_on_node > visible:
        return [f"{tasks_on_node} processes on this node share {visible} visible GPUs: "
                f"start one per GPU (srun --ntasks-per-node={visible}) or give each task "
                f"its own GPU (srun --gpus-per-task=1)"]
    return [f"{visible} GPUs are visible but only {tasks_on_node} process(es) run on this "
            f"node, so GPUs sit idle: use srun --ntasks-per-node={visible} or torchrun "
            f"--nproc-per-node={visible}"]


def _torchrun_problems(res: Resolution) -> list[str]:
    tasks = int(res.notes.get("slurm_tasks_on_node", "1"))
    if tasks > 1:
        return [f"torchrun is started once per task (SLURM runs {tasks} tasks on this "
                f"node) instead of once per node: use srun --ntasks-per-node=1 "
                f"(inside a batch job also --ntasks=$SLURM_NNODES)"]
    return []


def _batch_problems(res: Resolution) -> list[str]:
    if res.notes.get("in_step") != "False":
        return []
    job_tasks = int(res.notes.get("job_tasks", "1"))
    if job_tasks > 1 and res.layout != TORCHRUN:
        return [f"this process runs in the batch script, outside any srun step, but the "
                f"job has {job_tasks} tasks: start it with srun (SLURM_STEP_ID is unset)"]
    return []


def _is_address_guess(warning: str) -> bool:
    return warning.startswith(NO_ADDRESS)


def problems(res: Resolution, outer_torchrun: bool = False) -> list[str]:
    """Layout mistakes for the resolved process; empty when the layout is sound."""
    # Ranks on several nodes meeting at a guessed 127.0.0.1 cannot work: a problem.
    found = [warning for warning in res.warnings if _is_address_guess(warning)]
    found += _batch_problems(res)
    if res.layout == TORCHRUN:
        found += _torchrun_problems(res)
        if not outer_torchrun:
            found += _gpu_problems(res, int(res.values["LOCAL_WORLD_SIZE"]))
    elif res.layout == PER_TASK:
        found += _gpu_problems(res, int(res.values["LOCAL_WORLD_SIZE"]))
    return found


def notes(res: Resolution) -> list[str]:
    """Things worth knowing that are not errors (printed by check)."""
    lines = [f"warning: {warning}" for warning in res.warnings
             if not _is_address_guess(warning)]
    pitfall = res.notes.get("local_rank_pitfall")
    if pitfall and pitfall not in res.warnings:
        lines.append(f"warning: {pitfall}")
    step = res.notes.get("step_tasks")
    job = res.notes.get("job_tasks")
    if res.notes.get("in_step") == "True" and step and job and step != job:
        lines.append(f"note: this step runs {step} tasks of the job's {job} "
                     f"(SLURM_STEP_NUM_TASKS versus SLURM_NTASKS); WORLD_SIZE follows the step")
    return lines


# ------------------------------------------------------------------ the actions
def cmd_env(args: argparse.Namespace) -> int:
    res = resolve_for(args.command, os.environ)
    for warning in res.warnings:
        warn("launch", warning)
    pitfall = res.notes.get("local_rank_pitfall")
    if (pitfall and pitfall not in res.warnings
            and Path(args.command or "").name not in OWN_COMMANDS):
        warn("launch", pitfall)
    sys.stdout.write(render_env(res) + flight_recorder_lines(args.command)
                     + cache_lines(args.command))
    return 0


def cache_lines(command: str | None) -> str:
    """The cache folders chosen for a user's command (workload/caches.py), torchrun's
    workers included (a script that never calls setup()); the ones the environment
    already has are left to it. Not for this package's commands: each chooses its own."""
    if Path(command or "").name in OWN_COMMANDS:
        return ""
    env = dict(os.environ)
    plan = use_private_caches("launch", env, refuse_fatal=False)  # the command's own rules
    chosen = {**plan.chosen, ROOT_VARIABLE: str(plan.root)} if plan.chosen else {}
    return "".join(env_line(key, value) + "\n" for key, value in chosen.items())


def flight_recorder_lines(command: str | None) -> str:
    """The flight recorder's variables for a user's command; the ones the environment
    already has are left to it. Not for train (it sets its own, in its output dir) nor
    torchrun (its workers do: train, or a script through setup())."""
    if Path(command or "").name in OWN_COMMANDS or is_torchrun(command):
        return ""
    try:  # torch writes its dump there but does not create the folder
        folder = user_folder(os.environ)  # in the working folder, which may be gone
        added = apply_defaults(dict(os.environ), folder)
        # Checked before the folder is made: a value that cannot be one line stops here.
        lines = "".join(env_line(key, value) + "\n" for key, value in added.items())
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        warn("launch", f"no flight recorder dumps: cannot create "
             f"{exc.filename or 'diagnostics in the working folder'} ({exc.strerror})")
        return ""
    return lines


def cmd_check(args: argparse.Namespace) -> int:
    res = resolve_for(args.command, os.environ)
    found = problems(res, outer_torchrun=is_torchrun(args.command))
    values = res.values
    print(f"layout: {res.layout}" + (
        f", rank {values['RANK']} of {values['WORLD_SIZE']}" if "RANK" in values else "")
        + (f", rendezvous {values['MASTER_ADDR']}:{values['MASTER_PORT']}"
           if "MASTER_ADDR" in values else ""))
    for line in notes(res):
        print(line)
    for problem in found:
        print(f"problem: {problem}")
    print("check: ok" if not found else f"check: {len(found)} problem(s)")
    return 1 if found else 0


def cmd_jobs(args: argparse.Namespace) -> int:
    if not args.dest:  # Path("") is the working folder: the files would mix with its own
        raise LaunchError("DEST", "", "a folder for the job scripts", "name one, e.g. ./jobs")
    files = copy_jobs(Path(args.dest), force=args.force)
    print(f"copied {len(files)} files from {find_jobs()} to {args.dest}; submit with:")
    print(f"  {submit_command(Path(args.dest))}")
    return 0


def cmd_nccl(args: argparse.Namespace) -> int:
    fine, line = nccl.check(modules=args.module, needed=args.needs)
    print(line, file=sys.stdout if fine else sys.stderr)
    return 0 if fine else 2


def nccl_version(text: str) -> nccl.Version:
    version = nccl.parse(text)
    if version is None:
        shown = text if len(text) <= 40 else f"{text[:20]}... ({len(text)} characters)"
        raise argparse.ArgumentTypeError(f"{shown!r}: expected X.Y.Z, e.g. 2.27.7")
    return version


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m workload.launch",
                                     description=__doc__.split("\n\n")[0])
    add_version_argument(parser)
    sub = parser.add_subparsers(dest="action", required=True)
    for name, func, text in (("env", cmd_env, "print KEY=VALUE lines to source"),
                             ("check", cmd_check, "explain layout problems and fixes")):
        action = sub.add_parser(name, help=text)
        action.add_argument("--command", default=None,
                            help="the command about to run (torchrun gets per-node values)")
        action.set_defaults(func=func)
    jobs = sub.add_parser("jobs", help="copy the job scripts (jobs/) to DEST")
    jobs.add_argument("dest", nargs="?", default="jobs", help="target folder (default ./jobs)")
    jobs.add_argument("--force", action="store_true", help="overwrite files already there")
    jobs.set_defaults(func=cmd_jobs)
    check_nccl = sub.add_parser("nccl", help="stop when the libnccl on LD_LIBRARY_PATH is "
                                "older than the one torch was built with")
    check_nccl.add_argument("--module", action="append", default=[], metavar="NAME",
                            help="an NCCL module the site offers (repeat); the fix names "
                                 "the oldest one new enough")
    check_nccl.add_argument("--needs", type=nccl_version, default=None, metavar="X.Y.Z",
                            help="the version torch needs (default: ask torch)")
    check_nccl.set_defaults(func=cmd_nccl)
    return parser


def main(argv: list[str] | None = None) -> int:
    # A job step's signal ends it with the requeue status, as every command
    # (workload.commands.run_command); argv None: `python -m`, whose process ends after.
    with signals_from_the_start("launch", ENDING_SIGNALS, keep=argv is None):
        args = build_parser().parse_args(argv)
        try:
            return args.func(args)
        except LaunchError as exc:
            say(f"launch: error: {exc}", sys.stderr)
            return 2
        except OSError as exc:  # a full disk, a file system turned read-only: the user's fix
            if (line := failed_write_line(exc)) is None:
                raise
            say(f"launch: error: {line}", sys.stderr)
            return 2


if __name__ == "__main__":
    sys.exit(main())
