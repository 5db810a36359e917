"""An image as a small JSON file naming its architecture, and the checks a runtime makes
before it runs one: the node's architecture, the centre's network, the binds, the
module that holds the runtime, the login node's rules."""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

from tests.helpers.apptainer_def import header, rendered
from tests.twins.stand_ins.data_step import checked_data_step, fetch_without_torch
from tests.twins.stand_ins.node import CONFIG, fail, node_arch, on_compute, site_path

GO_ARCH = {"aarch64": "arm64", "x86_64": "amd64"}

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
    the twin's stand-in internet (twin.StandInInternet: its start-up hook first on
    PYTHONPATH)."""
    if "--download" in command:
        program = next((arg for arg in command if Path(arg).name == "train"), command[0])
        check_network(f"{Path(program).name} --download", env)
        env["PYTHONPATH"] = ":".join(filter(None, (env.get("TWIN_INTERNET_HOOK"),
                                                   env.get("PYTHONPATH"))))
        # The route was the centre's (its proxy checked above); the stand-in internet is
        # this host's loopback, which the centre's proxy address would not reach.
        env["no_proxy"] = env["NO_PROXY"] = "127.0.0.1"
        if checked_data_step(command):
            fetch_without_torch(command)
            sys.exit(0)
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
    # though the twin's folder is under the test machine's /var/tmp.)
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
