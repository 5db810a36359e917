"""CSCS's Container Engine: `srun --environment=EDF` runs each task as the EDF's image."""

from __future__ import annotations

import json
import os
import re
import sys
import tomllib
from pathlib import Path

from tests.twins.stand_ins.images import check_arch, run_in_image
from tests.twins.stand_ins.node import CONFIG, fail, site_path
from tests.twins.stand_ins.pyxis import pyxis_env
from tests.twins.stand_ins.requests import record


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
    # The [env] table "cannot reference other entries from [env] tables ... only environment
    # variables from the host can be referenced" (the EDF reference's Limitations).
    edf = expanded({k: v for k, v in raw.items() if k != "env"}, dict(os.environ) | image_env,
                   args[0]) | {"env": expanded(raw.get("env", {}), dict(os.environ), args[0])}
    for mount in edf.get("mounts", []):
        source = mount.split(":")[0]
        if not site_path(source).exists():
            fail(f"error: container-engine: mount source {source} does not exist")
    # The image's variables win over the host's (the CE is a customised pyxis, with
    # pyxis's rule; the EDF reference's [env]: "Inherited from the host and the image by
    # default"), the EDF's env over both (the EDF reference).
    env = pyxis_env({}, image_env, args[2:], "set it in the EDF's [env]") | {
        k: str(v) for k, v in edf.get("env", {}).items()}
    # "Empty string values will unset the variable" (the EDF reference's [env], read as
    # EDF_VARIABLE's).
    env = {key: value for key, value in env.items() if edf.get("env", {}).get(key) != ""}
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
