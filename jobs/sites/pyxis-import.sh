#!/usr/bin/env bash
# Import the published image for pyxis/enroot: one squashfs file that every job starts
# from (`srun --container-image=FILE`), instead of every job pulling from the registry.
#
# Usage: jobs/sites/pyxis-import.sh [IMAGE] [OUTPUT]
#   IMAGE   default ghcr.io#hpc-train/hpc-train:0.1.0 (enroot writes registry#repository)
#   OUTPUT  default ./hpc-train.sqsh
# Run it on a node of the target architecture (a GH200 node for the arm64 image), with
# ENROOT_CACHE_PATH on node-local or scratch storage. See docs/sites/pyxis.md.
set -Eeuo pipefail

main() {
  local image=${1:-ghcr.io#hpc-train/hpc-train:0.1.0} output=${2:-${PWD}/hpc-train.sqsh}
  if [[ -e ${output} ]]; then
    printf 'pyxis-import: %s exists; remove it or name another OUTPUT\n' "${output}" >&2
    exit 2
  fi
  exec enroot import --output "${output}" "docker://${image}"
}

if [[ ${BASH_SOURCE[0]} == "$0" ]]; then
  main "$@"
fi
