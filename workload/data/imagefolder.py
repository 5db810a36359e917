"""An image folder as a torchvision dataset (the rules of its walk and its reads:
workload.data.datasets), and the transforms of its samples. A module of its own because
torchvision's import takes seconds (torchvision.ops imports torch._dynamo): runs on
in-memory data, the suite's and a first job's, do without it.
"""

from __future__ import annotations

import os
from pathlib import Path

import torchvision.transforms.v2 as T
from torchvision.datasets import ImageFolder
from torchvision.datasets.folder import has_file_allowed_extension

from workload.data.augment import seeded
from workload.data.datasets import MAX_SKIPPED, UNREADABLE, bad_file_note, open_rgb, walk_once
from workload.errors import UsageError


class CheckedImageFolder(ImageFolder):
    """ImageFolder with a walk that detects loops and reads that skip bad files."""

    @staticmethod
    def make_dataset(directory, class_to_idx, extensions=None, is_valid_file=None,
                     allow_empty=False):
        samples = []
        found = set()
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

    def __getitem__(self, item: tuple[int, int]):
        """Items are (index, augmentation seed), as loaders.ShardSampler yields them."""
        index, seed = item
        for offset in range(MAX_SKIPPED + 1):
            path, target = self.samples[(index + offset) % len(self.samples)]
            try:
                sample = self.loader(path)
            except UNREADABLE as error:
                bad_file_note(path, error)
                continue
            return seeded(self.transform, sample, seed), target
        raise UsageError(f"{MAX_SKIPPED + 1} image files in a row cannot be read, from "
                         f"{self.samples[index][0]} on; check the files under {self.root}")

def folder_transforms(image_size: int, train: bool) -> T.Compose:
    """The transforms of an image folder's samples (and of a shard folder's)."""
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
        return CheckedImageFolder(str(folder), transform=folder_transforms(image_size, train),
                                  loader=open_rgb)
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
