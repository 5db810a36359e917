#!/usr/bin/env bash
# Makes arm64 programs run on this x86_64 machine (QEMU user emulation through binfmt_misc),
# or says what is missing. Needs root and Debian's qemu-user-static and binfmt-support
# (tools/debian-packages.txt). The handler is registered with the F flag, so it works
# inside chroots and containers too.
#
#   tests/image/qemu.sh     # exit 0 when arm64 binaries run
set -Eeuo pipefail

BINFMT=/proc/sys/fs/binfmt_misc

err() { echo "qemu.sh: $*" >&2; }

main() {
  if [[ ! -x /usr/bin/qemu-aarch64-static && ! -x /usr/libexec/qemu-binfmt/aarch64-binfmt-P ]]; then
    err "qemu-user-static is not installed: run tools/install-debian-packages.sh (as root)"
    exit 1
  fi
  mountpoint -q "${BINFMT}" || mount -t binfmt_misc binfmt_misc "${BINFMT}"
  [[ -e "${BINFMT}/qemu-aarch64" ]] || update-binfmts --enable qemu-aarch64 >/dev/null
  if ! grep -q '^flags: .*F' "${BINFMT}/qemu-aarch64" 2>/dev/null; then
    err "no qemu-aarch64 binfmt handler with the F flag in ${BINFMT}:" \
      "run 'update-binfmts --enable qemu-aarch64' as root (binfmt-support)"
    exit 1
  fi
}

main "$@"
