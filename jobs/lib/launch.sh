# shellcheck shell=bash
# The launch helper shared by the job scripts in jobs/. Sourced, not run: sourcing it
# defines functions and nothing else; a job script then calls one of
#
#   launch_train [train arguments...]              # run the training step
#   launch_train_requeueable [train arguments...]  # the same under jobs/lib/requeue.sh
#   launch_script [script arguments...]            # your own SCRIPT, in FORM, requeueable
#
# Settings come from the environment (sbatch passes it on):
#
#   LAYOUT         per-task (default): srun starts one task per GPU, each runs train;
#                  torchrun: one task per node, torchrun starts GPUS_PER_NODE workers
#   GPUS_PER_NODE  processes per node; default: the job's --gpus-per-node, else 1
#   RUNTIME        apptainer (default) | docker | none (the host's Python) | pyxis
#                  (docs/sites/pyxis.md) | edf (CSCS's Container Engine, needs EDF)
#   EDF            RUNTIME=edf: the environment definition (see jobs/sites/cscs-alps.toml)
#   IMAGE          apptainer: the .sif file (default ./hpc-train.sif); docker: the image
#   PRESET         optional fabric preset: a file name in jobs/presets without .sh
#   DATA_DIR       dataset folder, mounted at the same path (default ./data)
#   ENTRYPOINT     entrypoint.sh inside the image (default: on the image's PATH)
#   LAUNCH_CHECK   1: run `python -m workload.launch check` in the layout instead
#   JOBS_DIR       this jobs/ folder (default: found from this file)
#   CONTINUE       requeueable launches: requeue (default) | chain (the next job of a
#                  chain, for sites that forbid --requeue); MAX_ATTEMPTS_WITHOUT_PROGRESS,
#                  MIN_NODES, MAX_TIME_LIMIT_RESTARTS, MAX_PREEMPTIONS, TRAIN_RUN_ID,
#                  TRAIN_REQUEUE_FILE: see jobs/lib/requeue.sh
#   SPARE_NODES    requeueable launches: nodes of the allocation kept out of the first
#                  step, to restart a failed step on in the same job (sbatch --nodes=N+S
#                  --no-kill; default 0; docs/failures.md)
#   PREFLIGHT      requeueable train launches: 1 runs `doctor` on every node of the
#                  allocation before the first step, in the step's layout, and leaves the
#                  nodes it finds unfit out (docs/failures.md); default 0
#   PREFLIGHT_ARGS doctor's flags for it, split at spaces (e.g. --sweep-max-mib 64)
#   TRAIN_RUN_DIR  requeueable launches: the run folder the decision after each step reads
#                  and records in (docs/failures.md); default: train's --output-dir; a
#                  SCRIPT's run has none unless this names it (its --output-dir)
#   SCRIPT         launch_script: your training script (a path the image sees)
#   FORM           launch_script: per-task (default, through entrypoint.sh) | torchrun |
#                  no-entrypoint (the script calls workload.launch.setup(), your-script.md)
#   PYTHON         launch_script: the Python that runs SCRIPT (default python)
#
# The srun command is computed by jobstep.py, standard-library Python run on the batch
# host (workload/launch/jobstep.py says how a step is shaped and why); this file keeps
# what must be shell: sourcing the preset, running the step, and the requeue handling.

job_err() { printf 'job: %s\n' "$*" >&2; }

# The jobs/ folder: JOBS_DIR, else the parent of this file's folder.
jobs_dir() {
  if [[ -n ${JOBS_DIR:-} ]]; then
    printf '%s\n' "${JOBS_DIR}"
  else
    (cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
  fi
}

# Sources PRESET: its exports reach srun, which passes them to the tasks.
load_preset() {
  [[ -z ${PRESET:-} ]] && return 0
  local file
  if [[ ! ${PRESET} =~ ^[A-Za-z0-9_][A-Za-z0-9_.-]*$ ]]; then  # a name, not a path
    job_err "PRESET=${PRESET@Q}: expected a file name in jobs/presets without .sh; choose one" \
      "of: $(ls "$(jobs_dir)/presets")"
    exit 2
  fi
  file="$(jobs_dir)/presets/${PRESET}.sh"
  if [[ ! -f ${file} ]]; then
    job_err "PRESET=${PRESET}: no ${file}; choose one of: $(ls "$(jobs_dir)/presets")"
    exit 2
  fi
  # shellcheck source=/dev/null
  source "${file}"
}

# The step's srun command as NUL-terminated arguments. jobstep.py is in lib/ of a copied
# jobs/ folder (python -m workload.launch jobs), in the package in a source checkout.
print_step() {
  local dir file
  dir=$(jobs_dir)
  for file in "${dir}/lib/jobstep.py" "${dir}/../workload/launch/jobstep.py"; do
    if [[ -f ${file} ]]; then
      python3 "${file}" --jobs-dir "${dir}" "$@"
      return
    fi
  done
  job_err "no jobstep.py in ${dir}/lib: copy the job scripts with python -m workload.launch jobs"
  exit 2
}

# print_step's command (its arguments after the array's name) into the array NAME;
# a bad setting ends the job with print_step's status.
listed_command() {
  local name=$1 listing status=0
  shift
  listing=$(mktemp)
  print_step "$@" >"${listing}" || status=$?
  mapfile -d '' -t "${name}" <"${listing}"
  rm -f "${listing}"
  ((status == 0)) || exit "${status}"
}

# The step's command into STEP, on the nodes NODES of the allocation (jobs/lib/requeue.sh
# calls it when the decision moves the step: a restart on a spare, a shrink).
step_for_nodes() {
  export STEP_NODES=$1
  job_err "the step goes on on ${STEP_NODES}"
  listed_command STEP "${STEP_WHAT[@]}"
}

# With SPARE_NODES=S, the first step runs on the allocation's first N-S nodes (STEP_NODES):
# the last S are the spares a failed step restarts on (the job needs --no-kill, or SLURM
# ends it with its first lost node).
keep_spares() {
  local spares=${SPARE_NODES:-0}
  local -a nodes
  [[ ${spares} =~ ^[0-9]{1,4}$ ]] || {
    job_err "SPARE_NODES=${spares@Q}: expected a whole number of nodes, such as 1"; exit 2; }
  ((spares > 0)) || return 0
  mapfile -t nodes < <(scontrol show hostnames "${SLURM_JOB_NODELIST:-}")
  if ((${#nodes[@]} <= spares)); then
    job_err "SPARE_NODES=${spares}: the job has ${#nodes[@]} node(s), none left to train on;" \
      "ask for more (sbatch --nodes=N+${spares} --no-kill)"
    exit 2
  fi
  STEP_NODES=$(IFS=,; printf '%s' "${nodes[*]:0:${#nodes[@]}-spares}")
  export STEP_NODES
  job_err "spare node(s) kept for a restart: ${nodes[*]: -spares}"
}

# With PREFLIGHT=1 (a train step), doctor's command into PREFLIGHT_STEP: on the whole
# allocation, spares included (a restart may need them), its report into
# TRAIN_PREFLIGHT_REPORT; jobs/lib/requeue.sh runs it before the first step.
preflight_command() {
  local kept=${STEP_NODES:-}
  PREFLIGHT_STEP=()
  case ${PREFLIGHT:-0} in
    0) return 0 ;;
    1) [[ $1 == train ]] || return 0 ;;
    *) job_err "PREFLIGHT=${PREFLIGHT@Q}: expected 1 (doctor before the first step) or 0"
       exit 2 ;;
  esac
  shift
  export TRAIN_PREFLIGHT_REPORT=${PWD}/.train-preflight-${SLURM_JOB_ID:-local}.json
  export STEP_NODES=""
  listed_command PREFLIGHT_STEP preflight "$@"
  STEP_NODES=${kept}
}

# Runs the step; MODE requeueable runs it under jobs/lib/requeue.sh, which gets the srun
# command itself (not a function in a background subshell), so the signals it passes on
# reach srun, which sends them to every task, and runs the decision (DECIDE: diagnose in
# the image, on the run folder) after each step.
launch_step() {
  local mode=$1
  shift
  LAYOUT=${LAYOUT:-per-task}
  export LAYOUT
  load_preset
  STEP_WHAT=("$@")
  [[ ${mode} == requeueable ]] && keep_spares
  listed_command STEP "$@"
  if [[ ${mode} == requeueable ]]; then
    listed_command DECIDE decide "$@"
    preflight_command "$@"
    # shellcheck source=jobs/lib/requeue.sh
    source "$(jobs_dir)/lib/requeue.sh"
    run_requeueable "${STEP[@]}"
  else
    "${STEP[@]}"
  fi
}

# A user's SCRIPT is always requeueable: exit status 75 (exit_for_requeue) requeues it.
launch_train() { launch_step once train -- "$@"; }
launch_train_requeueable() { launch_step requeueable train -- "$@"; }
launch_script() { launch_step requeueable script -- "$@"; }
