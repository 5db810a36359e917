"""A mistake's run (TWIN_STEPS_CHECK=1) fetches the page's data without torch: the twin's
internet's archive into --data-dir, unpacked as torchvision unpacks it (what
`train --download --prepare-data` leaves there), so the steps after it find the folder
they bind, stage or read. A page's own run (Twin.run without steps_check) runs train."""

from __future__ import annotations

import hashlib
import json
import os
import tarfile
import urllib.request
from pathlib import Path

from tests.twins.stand_ins.node import fail

ARCHIVE = "cifar-100-python.tar.gz"  # torchvision's CIFAR100.filename
# tarfile's extraction filters (PEP 706) came in Python 3.11.4: Debian 12's 3.11.2 has none.
# The archive is the twin's own, checked against its md5 before it is unpacked.
DATA_FILTER = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}


def checked_data_step(command: list[str]) -> bool:
    """Whether `command` is a data step the check mode fetches without torch."""
    return (os.environ.get("TWIN_STEPS_CHECK") == "1" and "--download" in command
            and "--prepare-data" in command)


def data_dir_of(command: list[str]) -> Path:
    for index, arg in enumerate(command):
        if arg == "--data-dir" and index + 1 < len(command):
            return Path(command[index + 1]).expanduser()
        if arg.startswith("--data-dir="):
            return Path(arg.partition("=")[2]).expanduser()
    fail(f"the data step `{' '.join(command)}` names no --data-dir", 2)


def fetch_without_torch(command: list[str]) -> None:
    served = json.loads(Path(os.environ["TWIN_CIFAR_DOWNLOAD"]).read_text())
    folder = data_dir_of(command)
    folder.mkdir(parents=True, exist_ok=True)
    # The twin's internet is this host's loopback: no proxy of the centre's reaches it.
    with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(
            served["url"], timeout=60) as response:
        archive = response.read()
    if hashlib.md5(archive).hexdigest() != served["tgz_md5"]:
        fail(f"{served['url']}: not the archive the twin's internet served")
    (folder / ARCHIVE).write_bytes(archive)
    with tarfile.open(folder / ARCHIVE) as tar:
        tar.extractall(folder, **DATA_FILTER)
    print(f"twin: the data step in check mode: {served['url']} unpacked into {folder} "
          "without torch (train fetches it in the page's own run)", flush=True)
