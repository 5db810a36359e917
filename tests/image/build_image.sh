#!/usr/bin/env bash
# Builds the project's Dockerfile, unchanged, on a given base image (podman).
#
#   tests/image/build_image.sh BASE_IMAGE TAG [NAME=VALUE ...]   # extra --build-arg values
#   BUILD_PLATFORM=linux/arm64 tests/image/build_image.sh ...      # another architecture (QEMU)
#   INPUTS_KEY=HASH tests/image/build_image.sh ...   # the test suite's hash of the build's inputs,
#                                                    # as the label org.hpc-train.test.inputs
#
# The local package mirrors and CA bundle are mounted into RUN steps read-only (see
# containers.sh), never copied. Layers as users build them on overlay storage: a change
# to the package builds again only the steps from its COPY on, and the dependencies'
# step is reused (an arm64 rebuild under QEMU: 48 CPU-seconds instead of 152). On vfs
# every layer is a full copy of the 6 GB tree, so there the project's steps are committed
# as one layer (--layers=false): minutes and tens of GB less, the same content.
set -Eeuo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "${HERE}/../.." && pwd)"
# shellcheck source=tests/image/containers.sh
source "${HERE}/containers.sh"

main() {
  if (($# < 2)); then
    err "expected BASE_IMAGE and TAG, got $# arguments; usage: build_image.sh BASE_IMAGE TAG [NAME=VALUE ...]"
    exit 2
  fi
  local base="$1" tag="$2" digest arg extra=() layers=true
  shift 2
  for arg in "$@"; do extra+=(--build-arg "${arg}"); done
  [[ -z "${BUILD_PLATFORM:-}" ]] || extra+=(--platform "${BUILD_PLATFORM}")
  [[ -z "${INPUTS_KEY:-}" ]] || extra+=(--label "org.hpc-train.test.inputs=${INPUTS_KEY}")
  write_storage_conf
  write_pip_mount
  pip_build_volumes
  [[ "${STORAGE_DRIVER}" == overlay ]] || layers=false
  digest=$(podman image inspect --format '{{.Digest}}' "${base}")
  podman build --format docker --pull=never --layers="${layers}" "${PIP_VOLUMES[@]}" \
    --build-arg "BASE_IMAGE=${base}" \
    --build-arg "BASE_DIGEST=${digest}" \
    --build-arg "REVISION=$(git -C "${ROOT}" rev-parse HEAD)" \
    --build-arg "CREATED=$(date -u +%Y-%m-%dT%H:%M:%SZ)" \
    --build-arg "VERSION=$(sed -nE 's/^version = "(.*)"/\1/p' "${ROOT}/pyproject.toml")" \
    "${extra[@]}" --tag "${tag}" --file "${ROOT}/Dockerfile" "${ROOT}"
}

main "$@"
