# shellcheck shell=bash
# The launch helper shared by the job scripts in jobs/: the train command, the srun form
# for each layout, and how to run a command in the image. Sourced, not run: sourcing it
# defines functions and nothing else; a job script then calls one of
#
#   launch_train [train arguments...]              # run the training step
#   launch_train_requeueable [train arguments...]  # the same under jobs/lib/requeue.sh
#   launch_script [script arguments...]            # your own SCRIPT, in FORM, requeueable
#
# Settings come from the environment (sbatch passes it on):
#
#   LAYOUT         per-task (default): srun starts one task per GPU and each runs train;
#                  torchrun: srun starts one task per node and each runs torchrun, which
#                  starts GPUS_PER_NODE workers
#   GPUS_PER_NODE  GPUs (= training processes) per node; default: the job's
#                  --gpus-per-node (SLURM_GPUS_PER_NODE), else 1
#   RUNTIME        apptainer (default) | docker | none (the host's Python environment) |
#                  pyxis (srun --container-image=IMAGE, a .sqsh from `enroot import`; see
#                  docs/sites/pyxis.md) | edf (srun --environment=EDF, the CSCS Alps
#                  Container Engine; see docs/sites/cscs-alps.md)
#   EDF            RUNTIME=edf: the environment definition file (a .toml path or a name
#                  in ~/.edf; start from jobs/sites/cscs-alps.toml)
#   IMAGE          apptainer: the .sif file (default ./hpc-train.sif); docker: the image
#   PRESET         optional fabric preset, a file name in jobs/presets without .sh (for
#                  example slingshot-gh200); nothing is assumed about the fabric otherwise
#   DATA_DIR       dataset folder, mounted at the same path (default ./data)
#   ENTRYPOINT     entrypoint.sh inside the image (default: the one on the image's PATH)
#   LAUNCH_CHECK   set to 1: run `python -m workload.launch check` in the same layout
#                  instead of training, to check a layout before a long run
#   JOBS_DIR       this jobs/ folder (default: found from this file)
#   MAX_REQUEUES, TRAIN_REQUEUE_FILE   for the requeueable launches: see jobs/lib/requeue.sh
#   SCRIPT         launch_script: your training script (a path the image sees: the submit
#                  folder is bound, so a relative path works)
#   FORM           launch_script: per-task (default): one task per GPU through entrypoint.sh;
#                  torchrun: one task per node, entrypoint.sh torchrun --nproc-per-node;
#                  no-entrypoint: one task per GPU, python SCRIPT, which calls
#                  workload.launch.setup() itself (docs/your-script.md)
#   PYTHON         launch_script: the Python that runs SCRIPT (default python)
#
# The job scripts allocate whole nodes: one task per node holding the node's GPUs
# (--gpus-per-node) and CPUs (--cpus-per-task); this helper shapes the step from that, so
# `sbatch --nodes=4 --gpus-per-node=2 jobs/X.sbatch` needs nothing else. In the per-task
# layout every task sees the node's GPUs and train takes GPU LOCAL_RANK (GPUs visible to
# each other keep NCCL's peer-to-peer paths, which per-task GPU cgroups can cut).
#
# Why per-task is the default: train resolves rank, GPU and rendezvous from SLURM's own
# variables, so srun alone starts it -- no entrypoint, no second launcher, and one task
# per process for srun to signal, account and kill. torchrun is there for sites and
# habits that want it (the Olivia guide's way).

job_err() {
  printf 'job: %s\n' "$*" >&2
}

# The jobs/ folder: JOBS_DIR, else the parent of this file's folder.
jobs_dir() {
  if [[ -n ${JOBS_DIR:-} ]]; then
    printf '%s\n' "${JOBS_DIR}"
  else
    (cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
  fi
}

# Fills in the settings' defaults (see the header).
job_settings() {
  LAYOUT=${LAYOUT:-per-task}
  RUNTIME=${RUNTIME:-apptainer}
  IMAGE=${IMAGE:-${PWD}/hpc-train.sif}
  DATA_DIR=${DATA_DIR:-${PWD}/data}
  ENTRYPOINT=${ENTRYPOINT:-entrypoint.sh}
  local from_slurm=${SLURM_GPUS_PER_NODE:-1}
  GPUS_PER_NODE=${GPUS_PER_NODE:-${from_slurm##*:}}  # --gpus-per-node=a100:4 gives 4
  if [[ ! ${GPUS_PER_NODE} =~ ^[1-9][0-9]*$ ]]; then
    job_err "GPUS_PER_NODE=${GPUS_PER_NODE}: expected a whole number of GPUs, such as 4"
    exit 2
  fi
  if [[ ${SLURM_NTASKS_PER_NODE:-1} != 1 ]]; then
    job_err "--ntasks-per-node=${SLURM_NTASKS_PER_NODE}: the job scripts allocate one task" \
      "per node and start GPUS_PER_NODE processes per node themselves; set" \
      "--gpus-per-node (or GPUS_PER_NODE) instead"
    exit 2
  fi
}

# Sources the preset (its exports reach srun and the tasks), prints what it set (on
# stderr, into the job log) and adds its variables to PASS_TO_DOCKER.
load_preset() {
  [[ -z ${PRESET:-} ]] && return 0
  local file name
  file="$(jobs_dir)/presets/${PRESET}.sh"
  if [[ ! -f ${file} ]]; then
    job_err "PRESET=${PRESET}: no ${file}; choose one of: $(ls "$(jobs_dir)/presets")"
    exit 2
  fi
  # shellcheck source=/dev/null
  source "${file}"
  while read -r name; do
    printf 'preset %s: %s=%s\n' "${PRESET}" "${name}" "${!name-}" >&2
    PASS_TO_DOCKER+=("${name}")
  done < <(sed -n 's/^export \([A-Za-z_][A-Za-z0-9_]*\)=.*/\1/p' "${file}")
}

# Variables a docker container needs from the task (apptainer passes the environment).
# `docker run -e NAME` takes NAME's value from the docker client: the task's own value.
set_docker_names() {
  PASS_TO_DOCKER=(SLURM_JOB_ID SLURM_JOBID SLURM_STEP_ID SLURM_STEPID SLURM_PROCID
    SLURM_LOCALID SLURM_NODEID SLURM_NTASKS SLURM_NPROCS SLURM_NNODES SLURM_STEP_NUM_TASKS
    SLURM_STEP_NUM_NODES SLURM_STEP_NODELIST SLURM_JOB_NODELIST SLURM_NODELIST
    SLURM_STEP_TASKS_PER_NODE SLURM_TASKS_PER_NODE SLURM_CPUS_PER_TASK
    SLURM_JOB_NODELIST_HET_GROUP_0 CUDA_VISIBLE_DEVICES MASTER_ADDR MASTER_PORT
    OMP_NUM_THREADS TRAIN_REQUEUE_FILE)
}

# Sets IN_IMAGE (runs a command in the image as is: `train` resolves SLURM by itself),
# VIA_ENTRYPOINT (runs a command through entrypoint.sh: for torchrun) and IN_STEP (srun
# options that put the step in a container: pyxis and the CSCS Container Engine).
build_runtime() {
  IN_STEP=()
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
      VIA_ENTRYPOINT=("$(jobs_dir)/../entrypoint.sh")
      ;;
    pyxis)
      # pyxis starts in the image's WORKDIR and skips its ENTRYPOINT: start in this
      # folder (mounted at the same path) so relative paths stay on the host.
      IN_STEP=(--container-image="${IMAGE}" --container-mounts="${PWD},${DATA_DIR}"
        --container-workdir="${PWD}")
      IN_IMAGE=()
      VIA_ENTRYPOINT=("${ENTRYPOINT}")
      ;;
    edf)
      # The EDF names the image, the mounts and the working folder (and the NCCL hook).
      IN_STEP=(--environment="${EDF:?RUNTIME=edf needs EDF, e.g. EDF=\$PWD/jobs/sites/cscs-alps.toml}")
      IN_IMAGE=()
      VIA_ENTRYPOINT=("${ENTRYPOINT}")
      ;;
    *)
      job_err "RUNTIME=${RUNTIME}: expected apptainer, docker, none, pyxis or edf"
      exit 2
      ;;
  esac
}

# The training command, the one place it is written. The output folder stays the same
# across requeues: a requeued job keeps its id.
set_train_command() {
  TRAIN=(train --dataset cifar100 --data-dir "${DATA_DIR}" --batch-size 256 --epochs 100
    --base-lr 0.01 --target-accuracy 0.95 --patience 2
    --output-dir "runs/${SLURM_JOB_ID:?run the job scripts with sbatch}" "$@")
}

# Sets STEP (srun and its options) and COMMAND (what each task runs) for LAYOUT. Every
# step: --kill-on-bad-exit=1, so one failed rank ends the step instead of leaving the
# others waiting in a collective; --cpus-per-task passed explicitly, as Slurm 22.05-23.02
# srun does not inherit it from sbatch.
build_step() {
  local node_cpus=${SLURM_CPUS_PER_TASK:-}
  STEP=(srun --kill-on-bad-exit=1 "${IN_STEP[@]}")
  case ${LAYOUT} in
    per-task)
      STEP+=(--ntasks="$((SLURM_NNODES * GPUS_PER_NODE))" --ntasks-per-node="${GPUS_PER_NODE}")
      if [[ -n ${node_cpus} ]]; then
        cpus_per_gpu "${node_cpus}"
      fi
      COMMAND=("${IN_IMAGE[@]}" "${TRAIN[@]}")
      CHECK=("${IN_IMAGE[@]}" python -m workload.launch check)
      ;;
    torchrun)
      STEP+=(--ntasks="${SLURM_NNODES}" --ntasks-per-node=1)
      if [[ -n ${node_cpus} ]]; then
        STEP+=(--cpus-per-task="${node_cpus}")
      fi
      set_torchrun
      COMMAND=("${VIA_ENTRYPOINT[@]}" "${TORCHRUN[@]}" --no-python "${TRAIN[@]}")
      CHECK=("${IN_IMAGE[@]}" python -m workload.launch check --command torchrun)
      ;;
    *)
      job_err "LAYOUT=${LAYOUT}: expected per-task or torchrun"
      exit 2
      ;;
  esac
}

# Sets TORCHRUN: torchrun with GPUS_PER_NODE workers. torchrun dies of USR2 unless told
# to handle it; then it passes it on to its workers, which checkpoint (jobs/lib/requeue.sh,
# train's preemption handling, workload.launch.preemption in a user's script).
set_torchrun() {
  TORCHRUN=(torchrun --nproc-per-node="${GPUS_PER_NODE}"
    --signals-to-handle="SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR2")
}

# Splits a node's CPUs among its GPUS_PER_NODE tasks (adds --cpus-per-task to STEP).
cpus_per_gpu() {
  local node_cpus=$1
  if ((node_cpus < GPUS_PER_NODE)); then
    job_err "--cpus-per-task=${node_cpus} cannot be split among GPUS_PER_NODE=${GPUS_PER_NODE}" \
      "tasks: ask for at least one CPU per GPU (sbatch --cpus-per-task)"
    exit 2
  fi
  STEP+=(--cpus-per-task="$((node_cpus / GPUS_PER_NODE))")
}

# Sets LAUNCH: the whole srun command line, training or (LAUNCH_CHECK) checking.
prepare_launch() {
  job_settings
  set_docker_names
  load_preset
  build_runtime
  set_train_command "$@"
  build_step
  if [[ -n ${LAUNCH_CHECK:-} ]]; then
    LAUNCH=("${STEP[@]}" "${CHECK[@]}")
  else
    LAUNCH=("${STEP[@]}" "${COMMAND[@]}")
  fi
}

launch_train() {
  prepare_launch "$@"
  "${LAUNCH[@]}"
}

# run_requeueable gets the srun command itself (not a function in a background subshell),
# so the signals it passes on reach srun, which sends them to every task.
launch_train_requeueable() {
  # shellcheck source=jobs/lib/requeue.sh
  source "$(jobs_dir)/lib/requeue.sh"
  prepare_launch "$@"
  run_requeueable "${LAUNCH[@]}"
}

# Sets LAUNCH for a user's own SCRIPT in FORM (see the header): the same step shapes as
# train's layouts (per-task for per-task and no-entrypoint, torchrun for torchrun).
prepare_script_launch() {
  FORM=${FORM:-per-task}
  if [[ -z ${SCRIPT:-} ]]; then
    job_err "SCRIPT is not set: name your training script, e.g. SCRIPT=my_train.py sbatch jobs/own-script.sbatch"
    exit 2
  fi
  case ${FORM} in
    per-task | no-entrypoint) LAYOUT=per-task ;;
    torchrun) LAYOUT=torchrun ;;
    *)
      job_err "FORM=${FORM}: expected per-task, torchrun or no-entrypoint"
      exit 2
      ;;
  esac
  job_settings
  set_docker_names
  load_preset
  build_runtime
  TRAIN=()
  build_step
  local python=${PYTHON:-python}
  case ${FORM} in
    per-task) COMMAND=("${VIA_ENTRYPOINT[@]}" "${python}" "${SCRIPT}" "$@") ;;
    torchrun) COMMAND=("${VIA_ENTRYPOINT[@]}" "${TORCHRUN[@]}" "${SCRIPT}" "$@") ;;
    no-entrypoint) COMMAND=("${IN_IMAGE[@]}" "${python}" "${SCRIPT}" "$@") ;;
  esac
  if [[ -n ${LAUNCH_CHECK:-} ]]; then
    LAUNCH=("${STEP[@]}" "${CHECK[@]}")
  else
    LAUNCH=("${STEP[@]}" "${COMMAND[@]}")
  fi
}

# A user's own script under jobs/lib/requeue.sh: exit status 75 (workload.launch's
# exit_for_requeue) requeues the job; any other status is passed on.
launch_script() {
  # shellcheck source=jobs/lib/requeue.sh
  source "$(jobs_dir)/lib/requeue.sh"
  prepare_script_launch "$@"
  run_requeueable "${LAUNCH[@]}"
}
