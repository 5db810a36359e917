#!/usr/bin/env bash
# Shared settings for podman/buildah in the image tests (sourced, not run).
#
# This machine has no Docker engine, and its sandbox allows podman/buildah only as root
# with the vfs storage driver and chroot isolation (see shared/MACHINE.md). Images live in
# a private store under the project's cache, so a stand-in base built once is reused by
# later runs on the same machine, and a fresh machine rebuilds it.
#
#   source tests/image/containers.sh   # exports CONTAINERS_STORAGE_CONF, BUILDAH_ISOLATION

HPC_TRAIN_CACHE="${HPC_TRAIN_CACHE:-${HOME}/.cache/hpc-train}"
CONTAINERS_DIR="${HPC_TRAIN_CACHE}/containers"

err() { echo "$(basename "$0"): $*" >&2; }

# A storage.conf for this store: vfs, because overlay mounts are refused here.
write_storage_conf() {
  mkdir -p "${CONTAINERS_DIR}/storage" "${CONTAINERS_DIR}/run"
  cat >"${CONTAINERS_DIR}/storage.conf" <<CONF
[storage]
driver = "vfs"
graphroot = "${CONTAINERS_DIR}/storage"
runroot = "${CONTAINERS_DIR}/run"
CONF
  export CONTAINERS_STORAGE_CONF="${CONTAINERS_DIR}/storage.conf"
  export BUILDAH_ISOLATION=chroot
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
