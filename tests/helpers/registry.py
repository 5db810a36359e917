"""A real OCI registry on the loopback interface, the GPG key that signs what the release
script pushes there, and the policy that makes skopeo refuse anything else.

The registry is Debian's docker-registry (the CNCF distribution registry). Its storage
lives under the project's cache like the stand-in images, so a layer pushed once (the
multi-GB stand-in bases) is already there in later sessions; a fresh machine pays once.
It listens on a fixed port because skopeo's blob cache remembers which registry holds a
layer by host and port: on the same address a warm push skips compressing the base.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from tests.helpers.images import CACHE, containers_env

PORT = int(os.environ.get("HPC_TRAIN_REGISTRY_PORT", "5099"))
KEY_NAME = "hpc-train test release <release@hpc-train.invalid>"


@dataclass
class Registry:
    host: str
    root: Path          # this session's keys, policy and lookaside signatures
    fingerprint: str    # of the GPG key that signs releases

    @property
    def env(self) -> dict[str, str]:
        return dict(containers_env(), GNUPGHOME=str(self.root / "gnupg"))

    @property
    def registries_d(self) -> Path:
        return self.root / "registries.d"

    @property
    def policy(self) -> Path:
        return self.root / "policy.json"

    @property
    def signatures(self) -> Path:
        return self.root / "signatures"

    def skopeo(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        """skopeo with this registry's policy and lookaside signatures, over plain HTTP."""
        cmd = ["skopeo", "--policy", str(self.policy), "--registries.d", str(self.registries_d),
               *args]
        proc = subprocess.run(cmd, env=self.env, text=True, capture_output=True, timeout=900)
        if check and proc.returncode != 0:
            raise AssertionError(f"{' '.join(cmd)} exited {proc.returncode}\n{proc.stderr[-3000:]}")
        return proc


def _wait_until_serving(port: int, proc: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"docker-registry exited {proc.returncode}:\n{log.read_text()}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return
        time.sleep(0.1)
    raise RuntimeError(f"docker-registry did not listen on 127.0.0.1:{port}:\n{log.read_text()}")


def _write_config(root: Path, storage: Path) -> Path:
    config = root / "registry.yml"
    config.write_text(f"version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n"
                      f"    rootdirectory: {storage}\n  delete:\n    enabled: true\n"
                      f"http:\n  addr: 127.0.0.1:{PORT}\n  secret: hpc-train-test\n")
    return config


def _make_key(root: Path) -> str:
    """A fresh passphrase-less signing key for this session; returns its fingerprint."""
    home = root / "gnupg"
    home.mkdir(mode=0o700)
    env = dict(os.environ, GNUPGHOME=str(home))
    subprocess.run(["gpg", "--batch", "--quiet", "--passphrase", "", "--quick-gen-key",
                    KEY_NAME, "ed25519", "sign", "never"], env=env, check=True,
                   capture_output=True)
    listing = subprocess.run(["gpg", "--batch", "--with-colons", "--list-keys"], env=env,
                             check=True, capture_output=True, text=True).stdout
    fingerprint = next(line.split(":")[9] for line in listing.splitlines()
                       if line.startswith("fpr:"))
    with (root / "release.pub").open("wb") as public:
        subprocess.run(["gpg", "--batch", "--export", fingerprint], env=env, check=True,
                       stdout=public)
    return fingerprint


def _write_policy(root: Path, host: str) -> None:
    """Everything from this registry must carry a signature by the release key."""
    (root / "registries.d").mkdir()
    (root / "signatures").mkdir()
    signatures = f"file://{root / 'signatures'}"
    (root / "registries.d" / "local.yaml").write_text(
        f"docker:\n  {host}:\n    lookaside: {signatures}\n    lookaside-staging: {signatures}\n")
    # Any tag or digest of the signed repository: a pull by platform through the index
    # verifies the arm64 image's own signature, made for its site tag.
    signed = {"type": "signedBy", "keyType": "GPGKeys", "keyPath": str(root / "release.pub"),
              "signedIdentity": {"type": "matchRepository"}}
    insecure = [{"type": "insecureAcceptAnything"}]
    (root / "policy.json").write_text(json.dumps({
        "default": [{"type": "reject"}],
        "transports": {"docker": {host: [signed]},
                       "containers-storage": {"": insecure}, "oci": {"": insecure},
                       "dir": {"": insecure}}}, indent=1))


@contextlib.contextmanager
def local_registry(root: Path):
    """Starts the registry (one session at a time holds the cached storage), yields a
    Registry, stops it."""
    storage = CACHE / "registry"
    storage.mkdir(parents=True, exist_ok=True)
    with (CACHE / "registry.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        log = root / "registry.log"
        with log.open("w") as out:
            proc = subprocess.Popen(["docker-registry", "serve", str(_write_config(root, storage))],
                                    stdout=out, stderr=subprocess.STDOUT)
        try:
            _wait_until_serving(PORT, proc, log)
            host = f"127.0.0.1:{PORT}"
            fingerprint = _make_key(root)
            _write_policy(root, host)
            yield Registry(host, root, fingerprint)
        finally:
            proc.terminate()
            proc.wait(timeout=30)
            # gpg and skopeo's signing start an agent for the key's folder that outlives
            # them (a daemon left running after the suite, until the machine stops).
            subprocess.run(["gpgconf", "--kill", "gpg-agent"], timeout=30, capture_output=True,
                           env=dict(os.environ, GNUPGHOME=str(root / "gnupg")))
