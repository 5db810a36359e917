"""Caches on a /tmp shared between users: a cache folder this user cannot write (here: a
path through a regular file, which even root cannot create) moves to a private folder.
The image test runs `train` as an unprivileged UID with the image's cache settings."""

import os

from workload.files import ensure_writable_caches, private_cache_dir


def test_unwritable_cache_moves_to_a_private_folder(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    env = {"TRITON_CACHE_DIR": str(blocker / "triton"), "MPLCONFIGDIR": str(tmp_path / "mpl")}
    moved = ensure_writable_caches(env)
    assert moved == {"TRITON_CACHE_DIR": str(private_cache_dir("TRITON_CACHE_DIR"))}
    assert env["MPLCONFIGDIR"] == str(tmp_path / "mpl"), "a writable cache stays where it is"
    assert os.access(env["TRITON_CACHE_DIR"], os.W_OK)

