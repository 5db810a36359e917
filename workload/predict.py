"""`predict`: the top classes of images under a trained model, one JSON line per image.

Files or folders (read recursively), on the CPU or a GPU, in batches:
    predict runs/pets photo1.jpg photo2.png
    predict runs/pets $PROJECT/new-photos --top-k 3 --device cuda --batch-size 256 > out.jsonl

Each line: {"file": "photo1.jpg", "top": [{"class": "cat", "probability": 0.93}, ...]}; the
class is its name where the training data had names (image folders), else its index. An
image that cannot be read gets {"file": ..., "error": "..."} instead. Every image is resized
to the model's input size and normalised as its model.json says. A missing or damaged model
(model.json, model.safetensors) is refused with exit status 2 before any image is read.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from workload.caches import use_private_caches
from workload.commands import command_parser, main_of, start_up_over
from workload.config import add_flags
from workload.errors import UsageError
from workload.files import path_kind
from workload.models import ModelDescription, ModelFiles, locate, read_description

PROG = "predict"
# What a folder is searched for (a file named on the command line is read whatever its name).
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


def positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = command_parser(PROG, __doc__)
    p.add_argument("model", metavar="MODEL", help="a finished train run's --output-dir, or its "
                                                  "model.json")
    p.add_argument("images", metavar="IMAGES", nargs="+", help="image files or folders")
    p.add_argument("--top-k", type=positive, default=5, metavar="K",
                   help="classes per image, most probable first (default: 5)")
    add_flags(p, ("hardware",), only={"device"}, field_defaults=True)
    p.add_argument("--batch-size", type=positive, default=64, metavar="N",
                   help="images per forward pass (default: 64)")
    return p


def image_files(paths: list[str]) -> list[Path]:
    """The files named and the images under the folders named, in order, or a UsageError."""
    found: list[Path] = []
    for given in paths:
        path = Path(given).expanduser()
        if path.is_dir():
            inside = sorted(p for p in path.rglob("*")
                            if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)
            if not inside:
                raise UsageError(f"{given} holds no image files ({', '.join(IMAGE_SUFFIXES)})")
            found += inside
        elif path.is_file():
            found.append(path)
        elif path.exists():  # read, a FIFO waits for a writer and /dev/zero never ends
            raise UsageError(f"{given} is {path_kind(path)}, not a regular file; pass image "
                             "files or folders of them")
        else:
            raise UsageError(f"{given} does not exist; pass image files or folders of them")
    return found


def checked(args: argparse.Namespace) -> tuple[ModelFiles, ModelDescription, list[Path]]:
    files = locate(args.model)
    return files, read_description(files.description), image_files(args.images)


def read_batch(paths: list[Path], transform) -> tuple[list, dict[Path, str]]:
    """The uint8 tensors of the images that read, and why each other one did not."""
    from workload.data import UNREADABLE, open_rgb

    tensors = []
    errors = {}
    for path in paths:
        try:
            tensors.append(transform(open_rgb(path)))
        except UNREADABLE as error:
            errors[path] = (str(error).strip().splitlines()[0] if str(error).strip()
                            else type(error).__name__)
    return tensors, errors


def predict_batch(model, normalize, description: ModelDescription, tensors: list,
                  top_k: int, device) -> list[list[dict]]:
    """The top classes of each image, most probable first."""
    import torch

    with torch.no_grad():
        batch = normalize(torch.stack(tensors).to(device))
        probabilities = model(batch).float().softmax(1)
        values, indices = probabilities.topk(min(top_k, description.num_classes), dim=1)
    return [[dict(probability=p, **{"class": description.class_name(i)})
             for p, i in zip(row_p, row_i)]
            for row_p, row_i in zip(values.tolist(), indices.tolist())]


def predict(args: argparse.Namespace) -> None:
    files, description, paths = checked(args)
    use_private_caches(PROG)  # before torch is imported
    from workload.data import Normalizer, eval_transform
    from workload.distributed import batch_that_fits, resolve_device
    from workload.files import json_text
    from workload.models import load_described

    device = resolve_device(args.device)
    _, model = load_described(files)  # a damaged model: refused before any image is read
    model = model.to(device).eval()
    normalize = Normalizer(description.mean, description.std, device)
    transform = eval_transform(description.image_size, description.resize)
    start_up_over()
    for start in range(0, len(paths), args.batch_size):
        chunk = paths[start:start + args.batch_size]
        with batch_that_fits(args.batch_size, description.image_size, device):
            tensors, errors = read_batch(chunk, transform)
            tops = iter(predict_batch(model, normalize, description, tensors, args.top_k,
                                      device) if tensors else [])
        for path in chunk:
            line = (dict(file=str(path), error=errors[path]) if path in errors
                    else dict(file=str(path), top=next(tops)))
            print(json_text(line))
        sys.stdout.flush()


main = main_of(PROG, build_parser(), predict)


if __name__ == "__main__":
    sys.exit(main())
