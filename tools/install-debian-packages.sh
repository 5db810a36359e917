#!/usr/bin/env bash
# Installs the Debian packages the test suite drives for real (tools/debian-packages.txt:
# SLURM and munge for the private cluster, podman/buildah/debootstrap/mmdebstrap and QEMU
# for the image tests, dosfstools/fusefat for a FAT file system without hard links).
# Does nothing when they are all present; needs root (or sudo) to install missing ones.
set -Eeuo pipefail

err() {
  printf 'install-debian-packages: %s\n' "$*" >&2
}

missing_packages() {
  local pkg
  grep -vE '^\s*(#|$)' "$(dirname "$0")/debian-packages.txt" | while read -r pkg; do
    dpkg-query -W -f='${Status}' "${pkg}" 2>/dev/null | grep -q "ok installed" \
      || printf '%s\n' "${pkg}"
  done
}

main() {
  local missing=()
  mapfile -t missing < <(missing_packages)
  ((${#missing[@]})) || return 0
  local sudo=()
  if ((EUID != 0)); then
    command -v sudo >/dev/null || { err "need root to install: ${missing[*]}"; exit 1; }
    sudo=(sudo)
  fi
  echo "installing Debian packages: ${missing[*]}"
  "${sudo[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq \
    --no-install-recommends "${missing[@]}" >/dev/null
}

main "$@"
