# shellcheck shell=bash
# Alliance (Compute Canada): copy the dataset to each node's local disk ($SLURM_TMPDIR)
# once per node before training, as Alliance's "Using node-local storage" page advises
# for many small reads (https://docs.alliancecan.ca/wiki/Using_node-local_storage, read
# 2026-11-24: local disk beats /project, /scratch and /home for frequent small I/O).
# Sourced by a job script:
#
#   source jobs/sites/alliance-stage-data.sh
#   stage_dataset ~/projects/def-me/data/cifar-100-python.tar.gz   # sets DATA_DIR
#
# ARCHIVE may be a .tar / .tar.gz file (unpacked) or a folder (copied). One task per
# node does the copy (srun --ntasks-per-node=1, one CPU: tar and cp use one), every node
# gets the same path, and DATA_DIR points there, so jobs/lib/launch.sh binds it into the
# container.

stage_dataset() {
  local archive=${1:?stage_dataset ARCHIVE: a .tar(.gz) file or a folder}
  local nodes=${SLURM_NNODES:-1}
  if [[ -z ${SLURM_TMPDIR:-} ]]; then
    printf 'stage: SLURM_TMPDIR is not set: run this inside an Alliance job\n' >&2
    return 2
  fi
  DATA_DIR=${SLURM_TMPDIR}/data
  export DATA_DIR
  # Each task unpacks into a private folder beside DATA_DIR and renames it into place, so
  # DATA_DIR never holds a half copy, and tasks that share a disk (nodes of one host, a
  # shared SLURM_TMPDIR) cannot interleave their copies: the first rename wins, the
  # others find DATA_DIR there and drop theirs.
  # shellcheck disable=SC2016  # $1, $2 and ${tmp} belong to the inner bash (3 lines)
  local unpack='tar -xf "$1" -C "${tmp}"'
  # shellcheck disable=SC2016
  [[ ! -d ${archive} ]] || unpack='cp -r "$1"/. "${tmp}"/'
  # shellcheck disable=SC2016
  srun --ntasks="${nodes}" --ntasks-per-node=1 --cpus-per-task=1 bash -c \
    'mkdir -p "${2%/*}" && tmp=$(mktemp -d "$2.partial.XXXXXX") && '"${unpack}"' &&
     { mv -T "${tmp}" "$2" 2>/dev/null || { rm -rf "${tmp}"; [[ -d $2 ]]; }; }' \
    stage "${archive}" "${DATA_DIR}"
  printf 'stage: %s on every node at DATA_DIR=%s\n' "${archive}" "${DATA_DIR}" >&2
}
