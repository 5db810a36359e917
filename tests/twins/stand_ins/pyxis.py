"""pyxis: `srun --container-image=FILE` runs each task in the enroot image."""

from __future__ import annotations

import json
import os
from pathlib import Path

from tests.twins.stand_ins.images import GO_ARCH, image_arch, run_in_image
from tests.twins.stand_ins.node import CONFIG, fail, node_arch
from tests.twins.stand_ins.requests import record, trains


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
