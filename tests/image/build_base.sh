#!/usr/bin/env bash
# Builds the stand-in base images once per recipe and prints the name of the one asked for.
#
#   tests/image/build_base.sh        # -> localhost/hpc-train/ngc-standin:<recipe hash>
#   tests/image/build_base.sh ngc    # the same: the NGC stand-in (standin-base/)
#   tests/image/build_base.sh bare   # -> localhost/hpc-train/torch-standin:<recipe hash>
#
# bare (bare-base/) is Debian's Python with torch and torchvision only; ngc is built on
# top of it, so torch is installed once for both. The tag is a hash of this script,
# standin-base/ and bare-base/, so a changed recipe builds new images and an unchanged one
# is reused from the private store (containers.sh). A fresh machine builds them from
# scratch: debootstrap (about 1 min) and pip (about 5 min).
set -Eeuo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=tests/image/containers.sh
source "${HERE}/containers.sh"

SUITE=bookworm
MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
NGC_REPO=localhost/hpc-train/ngc-standin
BARE_REPO=localhost/hpc-train/torch-standin

recipe_hash() {
  cat "${HERE}/build_base.sh" "${HERE}/standin-base/"* "${HERE}/bare-base/"* | sha256sum | cut -c1-12
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

# build_standin IMAGE RECIPE_DIR BUILD_ARG: one Containerfile, committed as one layer.
build_standin() {
  local image="$1" recipe="$2" arg="$3"
  write_pip_mount
  pip_build_volumes
  echo "build_base: building ${image} from ${recipe}/ (${arg})" >&2
  podman build --quiet --format docker --pull=never --layers=false "${PIP_VOLUMES[@]}" \
    --build-arg "${arg}" --tag "${image}" "${HERE}/${recipe}" >/dev/null
}

# Old stand-ins (other recipe hashes) only take disk space: vfs stores whole copies.
remove_stale() {
  local hash="$1" repo ref
  for repo in "${NGC_REPO}" "${BARE_REPO}"; do
    for ref in $(podman images --format '{{.Repository}}:{{.Tag}}' --filter "reference=${repo}"); do
      [[ "${ref}" == "${repo}:${hash}" ]] || remove_image "${ref}"
    done
  done
}

main() {
  local which="${1:-ngc}" hash ngc bare rootfs
  if [[ "${which}" != ngc && "${which}" != bare ]]; then
    err "expected 'ngc' or 'bare', got '${which}'"
    exit 2
  fi
  write_storage_conf
  hash=$(recipe_hash)
  ngc="${NGC_REPO}:${hash}"
  bare="${BARE_REPO}:${hash}"
  rootfs="localhost/hpc-train/standin-rootfs:${hash}"
  exec 9>"${CONTAINERS_DIR}/build_base.lock"
  flock 9
  if ! image_exists "${bare}"; then
    echo "build_base: building ${bare} (${STORAGE_DRIVER} storage)" >&2
    image_exists "${rootfs}" || import_rootfs "${rootfs}"
    build_standin "${bare}" bare-base "ROOTFS=${rootfs}"
    remove_image "${rootfs}"
  fi
  if ! image_exists "${ngc}"; then
    build_standin "${ngc}" standin-base "TORCH_BASE=${bare}"
  fi
  remove_stale "${hash}"
  if [[ "${which}" == ngc ]]; then echo "${ngc}"; else echo "${bare}"; fi
}

main "$@"
