"""Image folders: a link loop is refused before any training, unreadable or empty image
files are skipped with a warning naming them (the next readable file takes their place)."""

from __future__ import annotations

import os

import pytest
import torch

from tests.helpers import write_image_folder
from workload.data.imagefolder import load_imagefolder
from workload.errors import UsageError


def test_a_symlink_loop_is_refused(tmp_path):
    write_image_folder(tmp_path, per_class=2)
    (tmp_path / "train" / "cat" / "again").symlink_to(tmp_path / "train")
    with pytest.raises(UsageError, match="symbolic link loop"):
        load_imagefolder(str(tmp_path), 32)


def test_unreadable_and_empty_images_are_skipped_with_a_warning(tmp_path, caplog):
    write_image_folder(tmp_path, per_class=3)
    cats = tmp_path / "train" / "cat"
    (cats / "0.jpg").write_bytes(b"")                   # 0 bytes
    (cats / "1.jpg").write_bytes(b"not an image at all")
    (cats / "00.jpg").symlink_to(tmp_path / "gone.jpg")  # cannot be opened
    os.mkfifo(cats / "01.jpg")  # an open for reading would wait for a writer forever
    os.symlink("/dev/zero", cats / "02.jpg")  # a device that never ends
    train, _ = load_imagefolder(str(tmp_path), 32)
    images = [train[(i, 0)] for i in range(len(train))]
    assert all(image.shape == (3, 32, 32) and image.dtype == torch.uint8
               for image, _ in images)
    for name in ("0.jpg", "1.jpg", "00.jpg"):
        assert f"skipping {cats / name}" in caplog.text
    assert f"skipping {cats / '01.jpg'}: it cannot be read as an image ({cats / '01.jpg'} " \
           "is a FIFO, not a file)" in caplog.text
    assert f"({cats / '02.jpg'} is a character device, not a file)" in caplog.text
    assert images[0][1] == images[1][1] == 0  # stand-ins come with their own labels
