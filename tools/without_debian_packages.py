#!/usr/bin/env python3
"""Run a command as on a machine without the Debian packages the suite installs.

    tools/without_debian_packages.py make check      # what .ci/run does once
    tools/without_debian_packages.py --list          # the packages that would be hidden

`make check` is a newcomer's first command: it must pass with none of the packages in
tools/debian-packages.txt. On a machine that has them (every developer's and CI's, after
`make test`), a fast test that reaches for one would pass unnoticed. So this runs the
command in a private mount namespace where every file those packages installed is gone:
the listed packages and what they pulled in (what `apt-get --auto-remove remove` would
take away), each file masked by an overlay whiteout over /usr, /etc, /var or /opt, so
`srun`, Lmod's init script or podman are absent (not empty, not unreadable) for the
command and everything it starts, and the rest of the machine is untouched.

Needs root (mount namespaces and overlays); standard library only. Exit status: the
command's, or 2 when the packages cannot be hidden.
"""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

PACKAGE_LIST = Path(__file__).resolve().parent / "debian-packages.txt"
INSIDE = "--inside-namespace"


def listed_packages() -> list[str]:
    lines = (line.split("#", 1)[0].strip() for line in PACKAGE_LIST.read_text().splitlines())
    return [line for line in lines if line]


def installed(packages: list[str]) -> list[str]:
    query = subprocess.run(["dpkg-query", "-W", "-f=${Package} ${Status}\\n", *packages],
                           capture_output=True, text=True)
    return [line.split()[0] for line in query.stdout.splitlines() if line.endswith(" installed")]


def packages_to_hide() -> list[str]:
    """The listed packages that are installed, and every package their removal would take
    with it: what depends on them, and what only they needed (apt's own simulation)."""
    present = installed(listed_packages())
    if not present:
        return []
    simulated = subprocess.run(["apt-get", "--simulate", "--auto-remove", "remove", *present],
                               capture_output=True, text=True, check=True)
    return sorted(set(re.findall(r"^Remv (\S+)", simulated.stdout, re.MULTILINE)))


def files_of(package: str) -> list[Path]:
    listing = subprocess.run(["dpkg-query", "-L", package], capture_output=True, text=True,
                             check=True)
    paths = (Path(line) for line in listing.stdout.splitlines() if line.startswith("/"))
    # A folder stays, and so does a link to one (/bin, /lib: others' files are in them);
    # what the package put there goes, dangling links included.
    return [path for path in paths if (path.is_symlink() or path.exists()) and not path.is_dir()]


def real_place(path: Path) -> Path:
    """Where the file really is: Debian 12 lists /bin/x and /lib/y as well as /usr/...,
    and /bin and /lib are links into /usr."""
    return path.parent.resolve() / path.name


def top_folder(path: Path) -> Path:
    return Path("/", path.parts[1])


def add_whiteout(upper: Path, path: Path) -> None:
    """An overlay whiteout (a 0/0 character device) in the upper layer hides the lower
    file; the folders on the way copy the lower ones' mode and owner."""
    target = upper / path.relative_to("/")
    for folder in reversed(target.relative_to(upper).parents[:-1]):
        made = upper / folder
        if not made.exists():
            lower = os.stat(Path("/", folder))
            made.mkdir()
            os.chown(made, lower.st_uid, lower.st_gid)
            made.chmod(stat.S_IMODE(lower.st_mode))
    if not target.exists():
        os.mknod(target, stat.S_IFCHR | 0o000, os.makedev(0, 0))


def mounts_under(folder: Path) -> list[Path]:
    targets = Path("/proc/self/mounts").read_text().split("\n")
    points = (Path(line.split()[1].encode().decode("unicode_escape"))
              for line in targets if line)
    return [point for point in points if folder in point.parents]


def overlay(folder: Path, layers: Path) -> None:
    """Mount an overlay of `folder` over itself (upper: the whiteouts), then put back the
    mounts that were under it, which the overlay would otherwise cover."""
    upper, work = layers / "upper" / folder.relative_to("/"), layers / "work" / folder.name
    work.mkdir(parents=True)
    kept = []
    for index, point in enumerate(mounts_under(folder)):
        holder = layers / "kept" / str(index)
        holder.parent.mkdir(exist_ok=True)
        holder.mkdir() if point.is_dir() else holder.touch()
        mount("--bind", point, holder)
        kept.append((holder, point))
    mount("-t", "overlay", "overlay", "-o",
          f"lowerdir={folder},upperdir={upper},workdir={work}", folder)
    for holder, point in kept:
        mount("--bind", holder, point)


def mount(*args) -> None:
    subprocess.run(["mount", *map(str, args)], check=True)


def hide(packages: list[str]) -> int:
    """Inside the private namespace: whiteouts for every file of `packages`; the number."""
    layers = Path(tempfile.mkdtemp(prefix="without-debian-packages-"))
    mount("-t", "tmpfs", "tmpfs", layers)  # whiteouts need a file system that takes them
    (layers / "upper").mkdir()
    files = {real_place(path) for package in packages for path in files_of(package)}
    tops = {top_folder(path) for path in files}
    for path in files:
        add_whiteout(layers / "upper", path)
    for top in sorted(tops):
        overlay(top, layers)
    return len(files)


def main(argv: list[str]) -> int:
    if argv[:1] == ["--list"]:
        print("\n".join(packages_to_hide()))
        return 0
    if argv[:1] != [INSIDE]:
        if not argv:
            print(__doc__.split("\n\n")[1], file=sys.stderr)
            return 2
        if os.geteuid() != 0:
            print("without_debian_packages: needs root (a mount namespace and overlays); "
                  "run it with sudo", file=sys.stderr)
            return 2
        unshare = ["unshare", "--mount", "--propagation", "private"]
        os.execvp(unshare[0], [*unshare, sys.executable, __file__, INSIDE, *argv])
    packages = packages_to_hide()
    hidden = hide(packages)
    print(f"without_debian_packages: {hidden} files of {len(packages)} packages hidden "
          f"({', '.join(installed(listed_packages())) or 'none installed'})", file=sys.stderr)
    os.execvp(argv[1], argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
