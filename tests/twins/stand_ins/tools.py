"""The site's other commands a page types: Lustre's `lfs setstripe` and `git clone` of
this project."""

from __future__ import annotations

from pathlib import Path

from tests.twins.stand_ins.images import check_network
from tests.twins.stand_ins.node import CONFIG, fail


def lfs(args: list[str]) -> None:
    """Lustre's `lfs setstripe ... DIR`: the folder must exist on a site file system."""
    if args[:1] != ["setstripe"]:
        fail(f"twin: lfs {' '.join(args)}: the twin has `lfs setstripe ... DIR` only")
    folder = Path(args[-1])
    if not folder.is_dir():
        fail(f"lfs setstripe: cannot create composite file '{folder}': No such file or "
             "directory", 2)
    if not any(str(folder).startswith(CONFIG["root_dir"] + root) for root in CONFIG["roots"]):
        fail(f"lfs setstripe: '{folder}' is not on a Lustre file system", 22)


def git(args: list[str]) -> None:
    """`git clone` of this project: its files, as links to this checkout."""
    if args[:1] != ["clone"] or args[1] != CONFIG["project_url"]:
        fail(f"twin: git {' '.join(args)}: the twin clones {CONFIG['project_url']} only")
    check_network("git clone")
    target = Path(args[2] if len(args) > 2 else Path(args[1]).name)
    target.mkdir()
    for entry in Path(CONFIG["repo"]).iterdir():
        if entry.name not in (".git", "runs", "data"):
            (target / entry.name).symlink_to(entry)
    print(f"Cloning into '{target}'...")
