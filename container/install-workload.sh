#!/usr/bin/env bash
# Installs the workload into an image that has torch, without replacing the base's builds
# of torch, torchvision or DALI. Shared by the Dockerfile and apptainer/hpc-train-ngc.def.
#
#   install-workload.sh deps SRC      # dependencies listed in SRC/pyproject.toml, DALI
#   install-workload.sh package SRC   # the package itself, without dependencies
#
# Made for NGC PyTorch, and needs nothing of it: any base whose `python` has torch works
# (the official PyTorch images, a plain Python image with torch).
#   - pip is held to NGC's constraint file when there is one (/etc/pip/constraint.txt, NGC
#     25.03 and later) and always to one written here from what the base has installed;
#     the step fails if torch's version changed all the same.
#   - DALI: the base's when it has one; else the wheel for the CUDA major of
#     CUDA_VERSION (NGC sets it) or of torch's own build; none for a CPU-only torch.
#     INSTALL_DALI=no skips it (the data backends then fall back to torch).
#   - A Python marked "externally managed" (PEP 668, e.g. Debian's): the base's torch lives
#     in its system site-packages, so the workload is installed there too, and it says so.
# Each step ends by printing what it installed; /opt/hpc-train/install.log keeps every line
# the steps printed (what the build added over the base, and why).
set -Eeuo pipefail

STATE_DIR=/opt/hpc-train
BASE_TORCH="${STATE_DIR}/base-torch-version"
BASE_CONSTRAINT="${STATE_DIR}/base-constraint.txt"

# What the steps say is also kept in the image, in INSTALL_RECORD: a step that a later
# build takes from the layer cache prints nothing in that build's log.
INSTALL_RECORD="${STATE_DIR}/install.log"

err() { echo "install-workload: $*" >&2; }
say() { echo "install-workload: $*" | tee -a "${INSTALL_RECORD}"; }

python() { command "${PYTHON}" "$@"; }

# torch's distribution version, from its installed metadata: importing torch takes seconds
# natively and over half a minute under QEMU (an arm64 image built on an x86_64 host), so
# only the deps step imports it (find_python), and what pip did is checked without it.
torch_distribution() { python -c 'from importlib.metadata import version; print(version("torch"))'; }

pip_install() {
  python -m pip install --no-warn-script-location --root-user-action=ignore "$@"
}

# `python` or, on bases without that name, `python3`; and it must have torch. STEP deps
# imports torch: its version as it imports, and the CUDA version it was built for (empty
# for a CPU-only build: DALI's wheel follows it). STEP package, which runs after deps, only
# needs torch's distribution, to see what pip does.
find_python() {
  local step="$1" facts
  PYTHON=$(type -P python || type -P python3 || true)
  if [[ -z "${PYTHON}" ]]; then
    err "no python or python3 on PATH; the base image needs Python with torch installed"
    exit 1
  fi
  if [[ "${step}" == deps ]]; then
    facts=$(python -c 'import torch; print(torch.__version__, torch.version.cuda or "")' \
      2>/dev/null) || facts=""
  else
    facts=$(torch_distribution 2>/dev/null) || facts=""
  fi
  if [[ -z "${facts}" ]]; then
    err "${PYTHON} has no torch that imports (step ${step}); use a base image with torch (e.g. nvcr.io/nvidia/pytorch)"
    exit 1
  fi
  read -r TORCH_VERSION TORCH_CUDA <<<"${facts}"
  if [[ "${step}" == deps ]]; then
    TORCH_DISTRIBUTION=$(torch_distribution)
  else
    TORCH_DISTRIBUTION="${TORCH_VERSION}"  # read from the distribution above
  fi
}

# PEP 668: pip refuses system-wide installs when the interpreter's stdlib folder holds an
# EXTERNALLY-MANAGED file and no virtual environment is active.
allow_externally_managed() {
  local marker
  marker=$(python -c 'import os, sys, sysconfig
m = os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED")
print(m if sys.prefix == sys.base_prefix and os.path.isfile(m) else "")')
  [[ -n "${marker}" ]] || return 0
  export PIP_BREAK_SYSTEM_PACKAGES=1
  say "${marker} marks this Python externally managed (PEP 668); installing into its" \
    "site-packages anyway, where the base's torch is (pip --break-system-packages)"
}

# name==version lines with PEP 503 names (python_hostlist -> python-hostlist): which spelling
# pip prints follows each release's metadata, and the output is read and compared.
normalised_freeze() {
  python -m pip list --format=freeze 2>/dev/null | python -c 'import re, sys
for line in sys.stdin:
    name, sep, version = line.strip().partition("==")
    print(re.sub(r"[-_.]+", "-", name).lower() + sep + version)'
}

installed() { normalised_freeze | sort; }

# What a step added or changed, as one line.
report_installed() {
  local before="$1" added
  added=$(comm -13 "${before}" <(installed) | paste -sd ' ' -)
  say "installed: ${added:-nothing new}"
}

# What the base ships, recorded once, before anything is installed.
record_base() {
  [[ -s "${BASE_TORCH}" ]] || echo "${TORCH_VERSION}" >"${BASE_TORCH}"
  [[ -s "${BASE_CONSTRAINT}" ]] || normalised_freeze |
    { grep -E '^(torch|torchvision|nvidia-dali-cuda[0-9]+)==' || true; } >"${BASE_CONSTRAINT}"
  local constraints="${PIP_CONSTRAINT:-} ${BASE_CONSTRAINT}"
  [[ ! -f /etc/pip/constraint.txt ]] || constraints+=" /etc/pip/constraint.txt"
  export PIP_CONSTRAINT="${constraints}"
}

# The CUDA major DALI must match: CUDA_VERSION (NGC's images set it), else torch's build;
# empty for a CPU-only torch.
cuda_major() {
  local version="${CUDA_VERSION:-${TORCH_CUDA}}"
  echo "${version%%.*}"
}

# DALI from the base when it has one, else the wheel for the base's CUDA major.
ensure_dali() {
  local major wheel
  if python -c 'import nvidia.dali' 2>/dev/null; then
    say "DALI from the base image"
    return
  fi
  major=$(cuda_major)
  if [[ -z "${major}" ]]; then
    say "DALI: none (torch is a CPU-only build and DALI's wheels are CUDA builds)"
    return
  fi
  wheel="nvidia-dali-cuda${major}0"
  if [[ "${INSTALL_DALI:-auto}" == no ]]; then
    say "DALI: skipped (INSTALL_DALI=no); the wheel for CUDA ${major} is ${wheel}"
    return
  fi
  local origin="torch's build"
  [[ -z "${CUDA_VERSION:-}" ]] || origin="CUDA_VERSION=${CUDA_VERSION}"
  say "DALI: installing ${wheel} (CUDA ${major}, from ${origin})"
  pip_install "${wheel}"
}

check_torch_kept() {
  local now
  now=$(torch_distribution)
  if [[ "${now}" != "${TORCH_DISTRIBUTION}" ]]; then
    err "pip changed the base image's torch $(cat "${BASE_TORCH}") (distribution" \
      "${TORCH_DISTRIBUTION}) to ${now}; find the dependency that requires another torch" \
      "and relax it"
    exit 1
  fi
}

install_deps() {
  local src="$1" reqs before
  reqs=$(mktemp)
  before=$(mktemp)
  installed >"${before}"
  python -c 'import sys, tomllib; print("\n".join(tomllib.load(open(sys.argv[1], "rb"))["project"]["dependencies"]))' \
    "${src}/pyproject.toml" >"${reqs}"
  pip_install -r "${reqs}"
  ensure_dali
  report_installed "${before}"
  rm -f "${reqs}" "${before}"
}

install_package() {
  local src="$1" before
  before=$(mktemp)
  installed >"${before}"
  pip_install --no-cache-dir --no-deps --no-build-isolation "${src}"
  rm -rf "${src}/build" "${src}/"*.egg-info
  command -v train >/dev/null || { err "train is not on PATH after the install"; exit 1; }
  report_installed "${before}"
  rm -f "${before}"
}

main() {
  if (($# != 2)) || [[ "$1" != deps && "$1" != package ]]; then
    err "expected 'deps SRC' or 'package SRC', got: $*"
    exit 2
  fi
  find_python "$1"
  mkdir -p "${STATE_DIR}"  # where the record and what the base has are kept
  allow_externally_managed
  record_base
  case "$1" in
    deps) install_deps "$2" ;;
    package) install_package "$2" ;;
  esac
  check_torch_kept
}

main "$@"
