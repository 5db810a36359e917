# shellcheck shell=bash
# Sigma2 Olivia: make the site's NCCL, aws-ofi-nccl, libfabric and libcxi (Slingshot)
# visible inside the Apptainer container, as Olivia's multi-node PyTorch guide does on its
# direct-container route, read 2026-11-25
# (https://documentation.sigma2.no/code_development/guides/pytorch_olivia/PyTorchMultiNode.html):
# it binds the modules' library folders and the host's /usr/lib64 (where libcxi lives),
# puts them first on the container's library path and sets FI_PROVIDER=cxi. Sourced by a
# job script after the modules are loaded (NCCL/... is found only after NRIS/GPU:
# https://documentation.sigma2.no/hpc_machines/olivia/nccl.html):
#
#   module reset; module load NRIS/GPU; module load NCCL/2.29.2-GCCcore-14.3.0-CUDA-12.9.1
#   source jobs/sites/sigma2-olivia-binds.sh
#   olivia_bind_nccl        # exports APPTAINER_BIND, APPTAINERENV_LD_LIBRARY_PATH, FI_PROVIDER
#   olivia_check_nccl       # stops (exit 2) when the bound libnccl is older than torch's
#
# The module folders are the LD_LIBRARY_PATH entries whose path names NCCL, OFI,
# libfabric or CXI; each is bound read-only at the same path. Apptainer passes most host
# variables into the container (the modules' NCCL and FI_* settings reach it), but not
# LD_LIBRARY_PATH, which is why the library path is set here; the image's own library
# path is kept after ours ("\$LD_LIBRARY_PATH" is evaluated in the container). Both:
# https://apptainer.org/docs/user/latest/environment_and_metadata.html, read 2026-11-25.
# It prints what it set. Check the result once in a job with NCCL_DEBUG=INFO: NCCL's log
# names the plugin it loaded.

# The host folder of libcxi, bound and put on the library path as Olivia's guide does.
OLIVIA_CXI_DIR=${OLIVIA_CXI_DIR:-/usr/lib64}

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
    printf 'olivia: no NCCL, OFI or libfabric folder on LD_LIBRARY_PATH: load the modules first (module load NRIS/GPU, then NCCL/...; module avail NCCL lists them)\n' >&2
    return 2
  fi
  if [[ -d ${OLIVIA_CXI_DIR} ]]; then
    binds+=",${OLIVIA_CXI_DIR}:${OLIVIA_CXI_DIR}:ro"
    libs+=":${OLIVIA_CXI_DIR}"
  fi
  export APPTAINER_BIND="${APPTAINER_BIND:+${APPTAINER_BIND},}${binds}"
  export APPTAINERENV_LD_LIBRARY_PATH="${libs}${APPTAINERENV_LD_LIBRARY_PATH:+:${APPTAINERENV_LD_LIBRARY_PATH}}:\$LD_LIBRARY_PATH"
  export FI_PROVIDER=${FI_PROVIDER:-cxi}
  printf 'olivia: APPTAINER_BIND=%s\nolivia: APPTAINERENV_LD_LIBRARY_PATH=%s\nolivia: FI_PROVIDER=%s\n' \
    "${APPTAINER_BIND}" "${APPTAINERENV_LD_LIBRARY_PATH}" "${FI_PROVIDER}" >&2
}

# Runs `python -m workload.launch nccl` where training will run (the image, with the
# binds above; RUNTIME=none: the host's python3 with the bound folders first), giving it
# the site's NCCL modules so that its one line names a module new enough. Returns 2 when
# the bound libnccl is older than the one torch was built with.
olivia_check_nccl() {
  local -a modules runner
  # Lmod's `module -t avail` lists one module a line, on stderr (NRIS/GPU loaded first).
  mapfile -t modules < <(module -t avail NCCL 2>&1 | grep '^NCCL/' || true)
  if [[ ${RUNTIME:-apptainer} == none ]]; then
    runner=(env "LD_LIBRARY_PATH=${APPTAINERENV_LD_LIBRARY_PATH%:\$LD_LIBRARY_PATH}${LD_LIBRARY_PATH:+:${LD_LIBRARY_PATH}}" python3)
  else
    runner=(apptainer exec --nv "${IMAGE:-hpc-train.sif}" python3)
  fi
  "${runner[@]}" -m workload.launch nccl "${modules[@]/#/--module=}"
}
