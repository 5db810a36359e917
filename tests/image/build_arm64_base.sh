#!/usr/bin/env bash
# Builds the arm64 (GH200) stand-in base once per recipe and prints its name; the image's
# RUN steps and the test's commands run under QEMU user emulation (qemu.sh).
#
#   tests/image/build_arm64_base.sh   # -> localhost/hpc-train/torch-standin-arm64:<recipe hash>
#
# Cached like build_base.sh's images, by a hash of this script. A fresh
# machine builds it from scratch, natively (about 2 min): emulating the assembly was
# the slowest part of a fresh machine's suite (debootstrap's second stage and pip under
# QEMU, over 10 min), and none of it is what the test proves. So mmdebstrap only
# extracts the arm64 packages (no maintainer scripts run: the few files they would make
# are written here), and the host's pip installs PyPI's aarch64 torch wheels into the
# tree (the bytecode it compiles is the same on both architectures for one Python
# version, and the script checks that the versions match). The Dockerfile's own RUN steps
# still run emulated, as a real arm64 build runs them.
set -Eeuo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=tests/image/containers.sh
source "${HERE}/containers.sh"

SUITE=bookworm
MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
REPO=localhost/hpc-train/torch-standin-arm64

recipe_hash() {
  sha256sum <"${HERE}/build_arm64_base.sh" | cut -c1-12
}

# Debian's Python and what the Dockerfile's RUN steps call (bash, coreutils, ...): only
# the packages named here and their dependencies are extracted, nothing is configured
# (libstdc++ for torch, which Debian's Python does not pull in).
PACKAGES=python3,python3-pip,python3-venv,python-is-python3,ca-certificates,bash,dash,\
coreutils,findutils,grep,sed,tar,gzip,debianutils,base-passwd,base-files,libstdc++6,libgcc-s1,zlib1g

# PyPI's newest CPU-only aarch64 torch (from 2.6 on, aarch64 wheels need CUDA libraries
# PyPI does not serve for aarch64); 2.5.1 imports in about 35 s emulated.
# pip evaluates dependency markers for the host, not for --platform (it would ask for
# x86_64's CUDA wheels), so the dependencies of both wheels are named here, --no-deps.
WHEELS=(torch==2.5.1 torchvision==0.20.1 filelock typing-extensions networkx jinja2
  MarkupSafe fsspec sympy==1.13.1 mpmath numpy pillow)

# What the skipped maintainer scripts would have made and the build needs: the accounts,
# /bin/sh, and the CA bundle (the same Debian certificates the host trusts).
configure_rootfs() {
  local root="$1"
  cp "${root}/usr/share/base-passwd/passwd.master" "${root}/etc/passwd"
  cp "${root}/usr/share/base-passwd/group.master" "${root}/etc/group"
  ln -sf dash "${root}/bin/sh"
  cp /etc/ssl/certs/ca-certificates.crt "${root}/etc/ssl/certs/ca-certificates.crt"
}

# Bytecode compiled on the host is valid in the image only for the same Python version.
python_version_of() { "$@" -c 'import sys; print("%d.%d" % sys.version_info[:2])'; }

# torch and torchvision into Debian's local site-packages, as `pip install` as root would
# put them, with their console scripts in /usr/local/bin pointing at the image's python.
install_torch() {
  local root="$1" version site staging script
  version=$(python_version_of chroot "${root}" /usr/bin/python3)
  if [[ "$(python_version_of python3)" != "${version}" ]]; then
    err "the host's python3 is not ${version}, the arm64 image's: its bytecode would not load there"
    return 1
  fi
  site="${root}/usr/local/lib/python${version}/dist-packages"
  staging="${root}/tmp/torch-install"
  python3 -m pip install --quiet --no-cache-dir --disable-pip-version-check --root-user-action=ignore \
    --platform manylinux2014_aarch64 --python-version "${version}" --implementation cp \
    --only-binary=:all: --no-deps --target "${staging}" "${WHEELS[@]}"
  mkdir -p "${site}" "${root}/usr/local/bin"
  for script in "${staging}/bin/"*; do
    sed '1s|^#!.*|#!/usr/bin/python3|' "${script}" >"${root}/usr/local/bin/$(basename "${script}")"
    chmod 755 "${root}/usr/local/bin/$(basename "${script}")"
  done
  rm -rf "${staging:?}/bin"
  mv "${staging}/"* "${site}/"
  rm -rf "${staging}"
}

# The tree is assembled in a scratch folder, removed however the script ends.
import_rootfs() {
  local name="$1" work
  work=$(mktemp -d "${HPC_TRAIN_CACHE}/rootfs-arm64.XXXXXX")
  # shellcheck disable=SC2064  # the folder is known now
  trap "rm -rf '${work}'" EXIT
  echo "build_arm64_base: arm64 ${SUITE} packages extracted, torch from PyPI (natively)" >&2
  if ! mmdebstrap --mode=root --arch=arm64 --variant=extract --include="${PACKAGES}" \
    "${SUITE}" "${work}/root" "${MIRROR}" >"${work}/mmdebstrap.log" 2>&1; then
    tail -20 "${work}/mmdebstrap.log" >&2
    return 1
  fi
  configure_rootfs "${work}/root"
  install_torch "${work}/root"
  rm -rf "${work}/root/var/cache/apt/archives/"*.deb "${work}/root/var/lib/apt/lists/"*
  tar -C "${work}/root" -cf - . |
    podman import --quiet --arch arm64 --change 'CMD ["python3"]' - "${name}" >/dev/null
}

main() {
  local hash image ref
  "${HERE}/qemu.sh"
  write_storage_conf
  hash=$(recipe_hash)
  image="${REPO}:${hash}"
  exec 9>"${CONTAINERS_DIR}/build_arm64_base.lock"
  flock 9
  if ! podman image exists "${image}"; then
    echo "build_arm64_base: building ${image} (${STORAGE_DRIVER} storage)" >&2
    import_rootfs "${image}"
    for ref in $(podman images --format '{{.Repository}}:{{.Tag}}' --filter "reference=${REPO}"); do
      [[ "${ref}" == "${image}" ]] || remove_image "${ref}"
    done
  fi
  echo "${image}"
}

main "$@"
