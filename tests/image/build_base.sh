#!/usr/bin/env bash
# Builds the stand-in NGC base image once per recipe and prints its name.
#
#   tests/image/build_base.sh        # -> localhost/hpc-train/ngc-standin:<recipe hash>
#
# The tag is a hash of this script and standin-base/, so a changed recipe builds a new
# image and an unchanged one is reused from the private store (containers.sh). A fresh
# machine builds it from scratch: debootstrap (about 1 min) and pip (about 5 min).
set -Eeuo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=tests/image/containers.sh
source "${HERE}/containers.sh"

SUITE=bookworm
MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
REPO=localhost/hpc-train/ngc-standin

recipe_hash() {
  cat "${HERE}/build_base.sh" "${HERE}/standin-base/"* | sha256sum | cut -c1-12
}

image_exists() { podman image exists "$1"; }

# debootstrap a minimal Debian and import it as a one-layer image.
import_rootfs() {
  local name="$1" work
  work=$(mktemp -d "${HPC_TRAIN_CACHE}/rootfs.XXXXXX")
  echo "build_base: debootstrap ${SUITE} minbase" >&2
  if ! debootstrap --variant=minbase \
    --include=python3,python3-pip,python3-venv,python-is-python3,ca-certificates \
    "${SUITE}" "${work}/root" "${MIRROR}" >"${work}/debootstrap.log" 2>&1; then
    tail -20 "${work}/debootstrap.log" >&2
    rm -rf "${work}"
    return 1
  fi
  rm -rf "${work}/root/var/cache/apt/archives/"*.deb "${work}/root/var/lib/apt/lists/"*
  tar -C "${work}/root" -cf - . | podman import --quiet - "${name}" >/dev/null
  rm -rf "${work}"
}

build_standin() {
  local image="$1" rootfs="$2"
  write_pip_mount
  pip_build_volumes
  echo "build_base: installing torch, torchvision and DALI into ${image}" >&2
  podman build --quiet --format docker --pull=never --layers=false "${PIP_VOLUMES[@]}" \
    --build-arg "ROOTFS=${rootfs}" --tag "${image}" "${HERE}/standin-base" >/dev/null
}

# Old stand-ins (other recipe hashes) only take disk space: vfs stores whole copies.
remove_stale() {
  local keep="$1" ref
  for ref in $(podman images --format '{{.Repository}}:{{.Tag}}' --filter "reference=${REPO}"); do
    [[ "${ref}" == "${keep}" ]] || podman rmi --force "${ref}" >/dev/null
  done
}

main() {
  local hash image rootfs
  write_storage_conf
  hash=$(recipe_hash)
  image="${REPO}:${hash}"
  rootfs="localhost/hpc-train/standin-rootfs:${hash}"
  exec 9>"${CONTAINERS_DIR}/build_base.lock"
  flock 9
  if ! image_exists "${image}"; then
    echo "build_base: building ${image} (${STORAGE_DRIVER} storage)" >&2
    image_exists "${rootfs}" || import_rootfs "${rootfs}"
    build_standin "${image}" "${rootfs}"
    podman rmi "${rootfs}" >/dev/null
    remove_stale "${image}"
  fi
  echo "${image}"
}

main "$@"
