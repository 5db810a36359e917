# shellcheck shell=bash
# shellcheck disable=SC2034  # IN_IMAGE, VIA_ENTRYPOINT and SRUN are for the scripts that source this
# Shared by the job scripts in jobs/: how to run a command in the image, and presets.
# Sourced, not run. Settings come from the environment (sbatch passes it on):
#
#   IMAGE       apptainer: the .sif file (default ./hpc-train.sif); docker: the image name
#   RUNTIME     apptainer (default) | docker | none (the host's Python environment: CPU tests)
#   PRESET      optional fabric preset, a file name in jobs/presets without .sh
#               (for example slingshot-gh200); nothing is assumed about the fabric otherwise
#   DATA_DIR    dataset folder, mounted at the same path (default ./data)
#   ENTRYPOINT  entrypoint.sh inside the image (default: the one on the image's PATH)
#
# It defines two arrays for srun:
#   IN_IMAGE         runs a command in the image as is: `train` resolves SLURM by itself
#   VIA_ENTRYPOINT   runs a command through entrypoint.sh: for torchrun (one task per node)

JOBS_DIR=${JOBS_DIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)}
IMAGE=${IMAGE:-${PWD}/hpc-train.sif}
RUNTIME=${RUNTIME:-apptainer}
DATA_DIR=${DATA_DIR:-${PWD}/data}
ENTRYPOINT=${ENTRYPOINT:-entrypoint.sh}

# Variables a docker container needs from the task (apptainer passes the environment).
# `docker run -e NAME` takes NAME's value from the docker client: the task's own value.
PASS_TO_DOCKER=(SLURM_JOB_ID SLURM_JOBID SLURM_STEP_ID SLURM_STEPID SLURM_PROCID
  SLURM_LOCALID SLURM_NODEID SLURM_NTASKS SLURM_NPROCS SLURM_NNODES SLURM_STEP_NUM_TASKS
  SLURM_STEP_NUM_NODES SLURM_STEP_NODELIST SLURM_JOB_NODELIST SLURM_NODELIST
  SLURM_STEP_TASKS_PER_NODE SLURM_TASKS_PER_NODE SLURM_CPUS_PER_TASK
  SLURM_JOB_NODELIST_HET_GROUP_0 CUDA_VISIBLE_DEVICES MASTER_ADDR MASTER_PORT
  OMP_NUM_THREADS TRAIN_REQUEUE_FILE)

job_err() {
  printf 'job: %s\n' "$*" >&2
}

load_preset() {
  [[ -z ${PRESET:-} ]] && return 0
  local file="${JOBS_DIR}/presets/${PRESET}.sh"
  if [[ ! -f ${file} ]]; then
    job_err "PRESET=${PRESET}: no ${file}; choose one of: $(ls "${JOBS_DIR}/presets")"
    exit 2
  fi
  # shellcheck source=/dev/null
  source "${file}"
  local name
  while read -r name; do
    PASS_TO_DOCKER+=("${name}")
  done < <(sed -n 's/^export \([A-Za-z_][A-Za-z0-9_]*\)=.*/\1/p' "${file}")
}

build_runtime() {
  case ${RUNTIME} in
    apptainer)
      IN_IMAGE=(apptainer exec --nv --bind "${DATA_DIR}" "${IMAGE}")
      VIA_ENTRYPOINT=("${IN_IMAGE[@]}" "${ENTRYPOINT}")
      ;;
    docker)
      # docker run runs the image's ENTRYPOINT (entrypoint.sh) by itself. Host network
      # and IPC for the rendezvous and NCCL's shared memory; all GPUs, narrowed by the
      # task's CUDA_VISIBLE_DEVICES.
      local envs=() name
      for name in "${PASS_TO_DOCKER[@]}"; do envs+=(-e "${name}"); done
      IN_IMAGE=(docker run --rm --gpus all --network host --ipc host
        --ulimit memlock=-1 --ulimit stack=67108864 -v "${DATA_DIR}:${DATA_DIR}"
        -v "${PWD}:${PWD}" -w "${PWD}" "${envs[@]}" "${IMAGE}")
      VIA_ENTRYPOINT=("${IN_IMAGE[@]}")
      ;;
    none)
      IN_IMAGE=()
      VIA_ENTRYPOINT=("${JOBS_DIR}/../entrypoint.sh")
      ;;
    *)
      job_err "RUNTIME=${RUNTIME}: expected apptainer, docker or none"
      exit 2
      ;;
  esac
}

# srun options every job uses: one failed rank ends the step instead of leaving the
# others waiting in a collective; CPUs per task passed on explicitly (Slurm 22.05-23.02
# srun does not inherit --cpus-per-task from sbatch).
SRUN=(srun --kill-on-bad-exit=1)
if [[ -n ${SLURM_CPUS_PER_TASK:-} ]]; then
  SRUN+=(--cpus-per-task="${SLURM_CPUS_PER_TASK}")
fi

load_preset
build_runtime
