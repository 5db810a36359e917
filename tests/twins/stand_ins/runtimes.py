"""The container runtimes: apptainer (build, pull, exec), podman (build, run) and enroot
(import)."""

from __future__ import annotations

import json
import os
import tomllib
from pathlib import Path

from tests.twins.stand_ins.images import (GO_ARCH, apptainer_build, check_arch, check_bound,
                                          check_login_node, check_module, check_network,
                                          recipe_env, run_in_image, write_image)
from tests.twins.stand_ins.node import CONFIG, fail, node_arch


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
        fail(f"twin: apptainer {action}: not in the twin; add it to "
             "tests/twins/stand_ins/runtimes.py")


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
