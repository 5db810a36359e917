"""The twins' normal user is let through the folders on the way to the test environment
(tests/helpers/users.py, grant_passage): one ACL entry, x alone, and nothing for others."""

from __future__ import annotations

import os

from tests.helpers.users import (GROUP_OBJ, MASK, NO_ID, OTHER, USER, USER_OBJ, acl_entries,
                                 grant_passage, with_passage)

SOMEONE = 65521


def test_passage_is_x_for_that_user_alone_and_the_mask_lets_it():
    plain = [(USER_OBJ, 7, NO_ID), (GROUP_OBJ, 0, NO_ID), (OTHER, 0, NO_ID)]
    assert with_passage(plain, SOMEONE) == [(USER_OBJ, 7, NO_ID), (USER, 1, SOMEONE),
                                            (GROUP_OBJ, 0, NO_ID), (MASK, 1, NO_ID),
                                            (OTHER, 0, NO_ID)]
    # A user who could read already keeps it; the mask covers the whole group class.
    mine = [(USER_OBJ, 7, NO_ID), (USER, 4, SOMEONE), (GROUP_OBJ, 5, NO_ID), (MASK, 4, NO_ID),
            (OTHER, 0, NO_ID)]
    assert (USER, 5, SOMEONE) in with_passage(mine, SOMEONE)
    assert (MASK, 5, NO_ID) in with_passage(mine, SOMEONE)


def test_only_the_folders_others_may_not_pass_are_changed(tmp_path):
    closed = tmp_path / "home"
    inner = closed / "open" / "env"
    inner.mkdir(parents=True)
    closed.chmod(0o700)
    changed = grant_passage(inner, SOMEONE, below=tmp_path)
    assert closed in changed and inner not in changed and (closed / "open") not in changed
    assert (USER, 1, SOMEONE) in acl_entries(closed)
    assert os.stat(closed).st_mode & 0o777 == 0o710  # the mask in the group bits: x
    assert grant_passage(inner, SOMEONE, below=tmp_path) == []  # granted once
