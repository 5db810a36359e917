"""The user's own images: one folder per class under `train/` and `val/`.

The rules (docs/data-and-models.md#your-own-images): the folders are walked following
symbolic links, but a folder reached twice (a link loop, or two links to one folder) stops
the run with exit status 2 naming the link, before any training. A file that cannot be read
or decoded (unreadable, 0 bytes, not an image) is skipped with a warning naming it: the next
file of the dataset that reads takes its place in the batch (always the same one, so a
resumed run sees what the uninterrupted run saw). More than MAX_SKIPPED bad files in a row
stop the run.
"""

from __future__ import annotations

import os
from pathlib import Path

import torchvision.transforms.v2 as T
from PIL import Image
from torchvision.datasets import ImageFolder
from torchvision.datasets.folder import has_file_allowed_extension

from workload.errors import UsageError
from workload.logs import logger

MAX_SKIPPED = 16
_warned: set[str] = set()  # files already named in a warning by this process


def walk_once(top: str):
    """os.walk following links, refusing a folder it reaches a second time."""
    seen: dict[tuple[int, int], str] = {}
    for root, dirs, files in os.walk(top, followlinks=True):
        info = os.stat(root)
        first = seen.setdefault((info.st_dev, info.st_ino), root)
        if first != root:
            raise UsageError(f"{root} leads back to {first} (a symbolic link loop, or two "
                             "links to one folder): the image folder would be read forever "
                             "or twice; remove the link")
        yield root, dirs, files


def bad_file_note(path: str, error: Exception) -> None:
    if path not in _warned:
        _warned.add(path)
        why = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        logger.warning(f"skipping {path}: it cannot be read as an image ({why}); the next "
                       "readable image takes its place")


class CheckedImageFolder(ImageFolder):
    """ImageFolder with a walk that detects loops and reads that skip bad files."""

    @staticmethod
    def make_dataset(directory, class_to_idx, extensions=None, is_valid_file=None,
                     allow_empty=False):
        samples, found = [], set()
        for name in sorted(class_to_idx):
            for root, _, files in sorted(walk_once(os.path.join(directory, name))):
                for file in sorted(files):
                    path = os.path.join(root, file)
                    if has_file_allowed_extension(path, extensions):
                        samples.append((path, class_to_idx[name]))
                        found.add(name)
        if set(class_to_idx) - found and not allow_empty:
            empty = ", ".join(sorted(set(class_to_idx) - found))
            raise FileNotFoundError(f"no image files in the class folders {empty}")
        return samples

    def __getitem__(self, index: int):
        for offset in range(MAX_SKIPPED + 1):
            path, target = self.samples[(index + offset) % len(self.samples)]
            try:
                sample = self.loader(path)
            except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as error:
                bad_file_note(path, error)
                continue
            return (self.transform(sample) if self.transform else sample), target
        raise UsageError(f"{MAX_SKIPPED + 1} image files in a row cannot be read, from "
                         f"{self.samples[index][0]} on; check the files under {self.root}")

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def _transforms(image_size: int, train: bool) -> T.Compose:
    # uint8 tensors leave the workers; normalisation runs batched on the training device.
    if train:
        steps = [T.RandomResizedCrop(image_size, antialias=True), T.RandomHorizontalFlip()]
        return T.Compose([T.PILToTensor(), *steps])
    return eval_transform(image_size, "resize-crop")


def eval_transform(image_size: int, resize: str) -> T.Compose:
    """A PIL image to the model's uint8 input, as the test split is read: `resize-crop`
    (image folders: the shorter side to 8/7 of the size, then the centre square) or
    `stretch` (the whole image to size x size: the in-memory datasets' square images)."""
    if resize == "resize-crop":
        steps = [T.Resize(image_size * 8 // 7, antialias=True), T.CenterCrop(image_size)]
    else:
        steps = [T.Resize((image_size, image_size), antialias=True)]
    return T.Compose([T.PILToTensor(), *steps])


def _open_split(root: Path, split: str, image_size: int, train: bool) -> ImageFolder:
    folder = root / split
    if not folder.is_dir():
        raise UsageError(f"--data-dir {root} has no {split}/ folder; an image folder dataset "
                         f"needs {root}/train/<class>/*.jpg and {root}/val/<class>/*.jpg")
    try:
        return CheckedImageFolder(str(folder), transform=_transforms(image_size, train))
    except (FileNotFoundError, PermissionError) as error:
        raise UsageError(f"cannot read images under {folder}: {error}; one sub-folder per "
                         "class with image files in each is expected") from None


def load_imagefolder(data_dir: str, image_size: int) -> tuple[ImageFolder, ImageFolder]:
    """The train and val splits (CheckedImageFolder: see the rules above)."""
    root = Path(data_dir).expanduser()
    train = _open_split(root, "train", image_size, train=True)
    val = _open_split(root, "val", image_size, train=False)
    if train.classes != val.classes:
        raise UsageError(f"{root}/train and {root}/val have different class folders "
                         f"({len(train.classes)} vs {len(val.classes)}); use the same names")
    return train, val
