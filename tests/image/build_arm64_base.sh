#!/usr/bin/env bash
# Builds the arm64 (GH200) stand-in base once per recipe and prints its name; the image's
# RUN steps and the test's commands run under QEMU user emulation (qemu.sh).
#
#   tests/image/build_arm64_base.sh   # -> localhost/hpc-train/torch-standin-arm64:<recipe hash>
#
# Cached like build_base.sh's images, by a hash of this script and arm64-base/. A fresh
# machine builds it from scratch: debootstrap --arch=arm64 (about 4 min, its second stage
# emulated) and pip (a few minutes, emulated).
set -Eeuo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=tests/image/containers.sh
source "${HERE}/containers.sh"

SUITE=bookworm
MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
REPO=localhost/hpc-train/torch-standin-arm64

recipe_hash() {
  cat "${HERE}/build_arm64_base.sh" "${HERE}/arm64-base/"* | sha256sum | cut -c1-12
}

import_rootfs() {
  local name="$1" work
  work=$(mktemp -d "${HPC_TRAIN_CACHE}/rootfs-arm64.XXXXXX")
  echo "build_arm64_base: debootstrap --arch=arm64 ${SUITE} minbase (emulated second stage)" >&2
  if ! debootstrap --arch=arm64 --variant=minbase \
    --include=python3,python3-pip,python3-venv,python-is-python3,ca-certificates \
    "${SUITE}" "${work}/root" "${MIRROR}" >"${work}/debootstrap.log" 2>&1; then
    tail -20 "${work}/debootstrap.log" >&2
    rm -rf "${work}"
    return 1
  fi
  rm -rf "${work}/root/var/cache/apt/archives/"*.deb "${work}/root/var/lib/apt/lists/"*
  tar -C "${work}/root" -cf - . | podman import --quiet --arch arm64 - "${name}" >/dev/null
  rm -rf "${work}"
}

main() {
  local hash image rootfs ref
  "${HERE}/qemu.sh"
  write_storage_conf
  hash=$(recipe_hash)
  image="${REPO}:${hash}"
  rootfs="localhost/hpc-train/standin-rootfs-arm64:${hash}"
  exec 9>"${CONTAINERS_DIR}/build_arm64_base.lock"
  flock 9
  if ! podman image exists "${image}"; then
    echo "build_arm64_base: building ${image} (${STORAGE_DRIVER} storage)" >&2
    podman image exists "${rootfs}" || import_rootfs "${rootfs}"
    write_pip_mount
    pip_build_volumes
    podman build --quiet --format docker --pull=never --layers=false --platform linux/arm64 \
      "${PIP_VOLUMES[@]}" --build-arg "ROOTFS=${rootfs}" --tag "${image}" \
      "${HERE}/arm64-base" >/dev/null
    podman rmi "${rootfs}" >/dev/null
    for ref in $(podman images --format '{{.Repository}}:{{.Tag}}' --filter "reference=${REPO}"); do
      [[ "${ref}" == "${image}" ]] || podman rmi --force "${ref}" >/dev/null
    done
  fi
  echo "${image}"
}

main "$@"
