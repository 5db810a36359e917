"""NERSC's Shifter: `shifterimg pull` and `shifter --image=...`."""

from __future__ import annotations

import os
from pathlib import Path

from tests.twins.stand_ins.images import GO_ARCH, image_arch, run_in_image, write_image
from tests.twins.stand_ins.node import CONFIG, fail, node_arch


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
