#!/usr/bin/env bash
# Shared settings for podman/buildah in the image tests (sourced, not run).
#
# This machine has no Docker engine; its sandbox allows podman/buildah as root with chroot
# isolation (see shared/MACHINE.md). Images live in a private store under the project's
# cache, so a stand-in base built once is reused by later runs on the same machine, and a
# fresh machine rebuilds it.
#
# Storage driver: overlay when the kernel lets this sandbox mount it (a container of the
# 7 GB base then costs nothing), else vfs, which always works but copies the whole tree
# for every container and every committed layer (about a minute each here).
# HPC_TRAIN_STORAGE_DRIVER=vfs|overlay forces one. Each driver has its own store.
#
#   source tests/image/containers.sh   # exports CONTAINERS_STORAGE_CONF, BUILDAH_ISOLATION

HPC_TRAIN_CACHE="${HPC_TRAIN_CACHE:-${HOME}/.cache/hpc-train}"
CONTAINERS_DIR="${HPC_TRAIN_CACHE}/containers"

err() { echo "$(basename "$0"): $*" >&2; }

# remove_image REF: an image and the build containers still using it. A build killed
# half-way leaves its working container (IMAGE-working-container) behind, and podman
# refuses to remove an image that a buildah container uses, even with --force.
remove_image() {
  local ref="$1"
  buildah containers --quiet --filter "ancestor=${ref}" | xargs -r buildah rm >/dev/null
  podman rmi --force "${ref}" >/dev/null
}

storage_conf() {
  local driver="$1" dir="$2"
  printf '[storage]\ndriver = "%s"\ngraphroot = "%s/storage"\nrunroot = "%s/run"\n' \
    "${driver}" "${dir}" "${dir}"
}

# Can this sandbox mount overlay? Tried in a throwaway store.
overlay_works() {
  local probe="${CONTAINERS_DIR}/probe-$$" ctr ok=1
  mkdir -p "${probe}"
  storage_conf overlay "${probe}" >"${probe}/storage.conf"
  if ctr=$(CONTAINERS_STORAGE_CONF="${probe}/storage.conf" buildah from scratch 2>/dev/null); then
    CONTAINERS_STORAGE_CONF="${probe}/storage.conf" buildah mount "${ctr}" >/dev/null 2>&1 && ok=0
    CONTAINERS_STORAGE_CONF="${probe}/storage.conf" buildah rm "${ctr}" >/dev/null 2>&1 || true
  fi
  rm -rf "${probe}" 2>/dev/null || true
  return "${ok}"
}

# Writes ${CONTAINERS_DIR}/storage.conf for the chosen driver and exports it.
write_storage_conf() {
  local driver="${HPC_TRAIN_STORAGE_DRIVER:-}"
  mkdir -p "${CONTAINERS_DIR}"
  if [[ -z "${driver}" ]]; then
    if overlay_works; then driver=overlay; else driver=vfs; fi
  fi
  mkdir -p "${CONTAINERS_DIR}/${driver}"
  storage_conf "${driver}" "${CONTAINERS_DIR}/${driver}" >"${CONTAINERS_DIR}/storage.conf.$$"
  mv "${CONTAINERS_DIR}/storage.conf.$$" "${CONTAINERS_DIR}/storage.conf"
  export CONTAINERS_STORAGE_CONF="${CONTAINERS_DIR}/storage.conf"
  export BUILDAH_ISOLATION=chroot
  export STORAGE_DRIVER="${driver}"
}

# The host's pip settings as one read-only folder for builds: pip inside a build then
# reaches the same package mirrors and trusts the same CA bundle as pip on the host. It
# is mounted at /etc/xdg/pip (pip's global configuration folder) during RUN steps only,
# so nothing of it lands in a layer.
write_pip_mount() {
  local dir="${CONTAINERS_DIR}/pip-mount" key value cert
  mkdir -p "${dir}"
  cert="${PIP_CERT:-$(python3 -m pip config get global.cert 2>/dev/null || true)}"
  cert="${cert:-/etc/ssl/certs/ca-certificates.crt}"
  cp "${cert}" "${dir}/ca.crt"
  {
    echo "[global]"
    echo "cert = /etc/xdg/pip/ca.crt"
    for key in find-links index-url extra-index-url timeout default-timeout; do
      value=$(python3 -m pip config get "global.${key}" 2>/dev/null || true)
      [[ -z "${value}" ]] || echo "${key} = ${value}"
    done
    [[ -z "${PIP_FIND_LINKS:-}" ]] || echo "find-links = ${PIP_FIND_LINKS}"
  } | awk -F' = ' '!seen[$1]++' >"${dir}/pip.conf"
  PIP_MOUNT_DIR="${dir}"
}

# podman build flags that mount the pip folder and every local mirror it names.
pip_build_volumes() {
  local path
  PIP_VOLUMES=(--volume "${PIP_MOUNT_DIR}:/etc/xdg/pip:ro")
  while read -r path; do
    [[ "${path}" == /etc/xdg/pip/* ]] && continue
    path="${path%/simple}"
    [[ -d "${path}" ]] && PIP_VOLUMES+=(--volume "${path}:${path}:ro")
  done < <(grep -oE '(file://)?/[^ ]+' "${PIP_MOUNT_DIR}/pip.conf" | sed 's|^file://||' | sort -u)
}
