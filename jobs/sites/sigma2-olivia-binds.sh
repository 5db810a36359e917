# shellcheck shell=bash
# Sigma2 Olivia: make the site's NCCL, aws-ofi-nccl and libfabric (Slingshot) visible
# inside the Apptainer container, as Olivia's NCCL page advises for containers
# (https://documentation.sigma2.no/hpc_machines/olivia/nccl.html). Sourced by a job
# script after `module load NCCL/...` (the module loads the matching plugin):
#
#   module load NCCL/2.27.7-GCCcore-14.3.0-CUDA-12.9.1
#   source jobs/sites/sigma2-olivia-binds.sh
#   olivia_bind_nccl        # exports APPTAINER_BIND and APPTAINERENV_LD_LIBRARY_PATH
#   olivia_check_nccl       # stops (exit 2) when the bound libnccl is older than torch's
#
# It takes the library folders from the loaded modules (the LD_LIBRARY_PATH entries
# whose path names NCCL, OFI, libfabric or CXI), binds each read-only at the same path,
# and puts them first on the container's library path. It prints what it set. Check the
# result once in a job with NCCL_DEBUG=INFO: NCCL's log names the plugin it loaded.

# Prints the host library folders of the NCCL stack, one per line.
olivia_nccl_dirs() {
  local dir
  local -a dirs
  IFS=: read -r -a dirs <<<"${LD_LIBRARY_PATH:-}"
  for dir in "${dirs[@]}"; do
    if [[ -d ${dir} && ${dir,,} =~ (nccl|ofi|fabric|cxi) ]]; then
      printf '%s\n' "${dir}"
    fi
  done
}

olivia_bind_nccl() {
  local dir binds="" libs=""
  while read -r dir; do
    binds+="${binds:+,}${dir}:${dir}:ro"
    libs+="${libs:+:}${dir}"
  done < <(olivia_nccl_dirs)
  if [[ -z ${libs} ]]; then
    printf 'olivia: no NCCL, OFI or libfabric folder on LD_LIBRARY_PATH: load an NCCL module first (ml avail nccl)\n' >&2
    return 2
  fi
  export APPTAINER_BIND="${APPTAINER_BIND:+${APPTAINER_BIND},}${binds}"
  export APPTAINERENV_LD_LIBRARY_PATH="${libs}${APPTAINERENV_LD_LIBRARY_PATH:+:${APPTAINERENV_LD_LIBRARY_PATH}}"
  printf 'olivia: APPTAINER_BIND=%s\nolivia: APPTAINERENV_LD_LIBRARY_PATH=%s\n' \
    "${APPTAINER_BIND}" "${APPTAINERENV_LD_LIBRARY_PATH}" >&2
}

# Runs `python -m workload.launch nccl` where training will run (the image, with the
# binds above; RUNTIME=none: the host's python3 with the bound folders first), giving it
# the site's NCCL modules so that its one line names a module new enough. Returns 2 when
# the bound libnccl is older than the one torch was built with.
olivia_check_nccl() {
  local -a modules runner
  # Lmod's `module -t avail` lists one module a line, on stderr.
  mapfile -t modules < <(module -t avail NCCL 2>&1 | grep '^NCCL/' || true)
  if [[ ${RUNTIME:-apptainer} == none ]]; then
    runner=(env "LD_LIBRARY_PATH=${APPTAINERENV_LD_LIBRARY_PATH:-}${LD_LIBRARY_PATH:+:${LD_LIBRARY_PATH}}" python3)
  else
    runner=(apptainer exec --nv "${IMAGE:-hpc-train.sif}" python3)
  fi
  "${runner[@]}" -m workload.launch nccl "${modules[@]/#/--module=}"
}
