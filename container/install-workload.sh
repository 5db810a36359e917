#!/usr/bin/env bash
# Installs the workload into an NGC PyTorch image without replacing NVIDIA's builds of
# torch, torchvision or DALI. Shared by the Dockerfile and apptainer/hpc-train-ngc.def.
#
#   install-workload.sh deps SRC      # dependencies listed in SRC/pyproject.toml, DALI
#   install-workload.sh package SRC   # the package itself, without dependencies
#
# pip is held to NGC's constraint file (/etc/pip/constraint.txt, NGC 25.03 and later) and
# to one written here from what the base has installed; the step fails if torch's version
# changed all the same.
set -Eeuo pipefail

STATE_DIR=/opt/hpc-train
BASE_TORCH="${STATE_DIR}/base-torch-version"
BASE_CONSTRAINT="${STATE_DIR}/base-constraint.txt"

err() { echo "install-workload: $*" >&2; }

torch_version() { python -c 'import torch; print(torch.__version__)'; }

pip_install() {
  python -m pip install --no-warn-script-location --root-user-action=ignore "$@"
}

# What the base ships, recorded once, before anything is installed.
record_base() {
  mkdir -p "${STATE_DIR}"
  [[ -s "${BASE_TORCH}" ]] || torch_version >"${BASE_TORCH}"
  [[ -s "${BASE_CONSTRAINT}" ]] || python -m pip list --format=freeze |
    grep -iE '^(torch|torchvision|nvidia-dali-cuda[0-9]+)==' >"${BASE_CONSTRAINT}"
  local constraints="${PIP_CONSTRAINT:-} ${BASE_CONSTRAINT}"
  [[ ! -f /etc/pip/constraint.txt ]] || constraints+=" /etc/pip/constraint.txt"
  export PIP_CONSTRAINT="${constraints}"
}

# DALI from the base when it has one, else the wheel for the base's CUDA major.
ensure_dali() {
  if python -c 'import nvidia.dali' 2>/dev/null; then
    echo "install-workload: DALI from the base image"
    return
  fi
  local major="${CUDA_VERSION%%.*}"
  [[ -n "${major}" ]] ||
    major=$(python -c 'import torch; print((torch.version.cuda or "12").split(".")[0])')
  pip_install "nvidia-dali-cuda${major}0"
}

check_torch_kept() {
  local now
  now=$(torch_version)
  if [[ "${now}" != "$(cat "${BASE_TORCH}")" ]]; then
    err "pip changed the base image's torch $(cat "${BASE_TORCH}") to ${now};" \
      "find the dependency that requires another torch and relax it"
    exit 1
  fi
}

install_deps() {
  local src="$1" reqs
  reqs=$(mktemp)
  python -c 'import sys, tomllib; print("\n".join(tomllib.load(open(sys.argv[1], "rb"))["project"]["dependencies"]))' \
    "${src}/pyproject.toml" >"${reqs}"
  pip_install -r "${reqs}"
  rm -f "${reqs}"
  ensure_dali
}

install_package() {
  local src="$1"
  pip_install --no-cache-dir --no-deps --no-build-isolation "${src}"
  rm -rf "${src}/build" "${src}/"*.egg-info
  command -v train >/dev/null || { err "train is not on PATH after the install"; exit 1; }
}

main() {
  if (($# != 2)) || [[ "$1" != deps && "$1" != package ]]; then
    err "expected 'deps SRC' or 'package SRC', got: $*"
    exit 2
  fi
  record_base
  case "$1" in
    deps) install_deps "$2" ;;
    package) install_package "$2" ;;
  esac
  check_torch_kept
}

main "$@"
