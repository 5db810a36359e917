# shellcheck shell=bash
# Preemption, time limits and the run's continuation for job scripts: run the training
# step in the background, pass the batch shell's signals on to it, and, when train exits
# with the "requeue me" status, continue the run: requeue this job (CONTINUE=requeue), or
# submit the next job of a chain (CONTINUE=chain, for sites that forbid --requeue).
# Sourced, not run:
#
#   #SBATCH --signal=B:USR2@300   # USR2 to this batch shell 300 s before the time limit
#   #SBATCH --requeue             # the job may be requeued (CONTINUE=requeue)
#   #SBATCH --open-mode=append    # a requeued job appends to the same log
#   source jobs/lib/requeue.sh
#   run_requeueable srun ... train --output-dir "runs/${TRAIN_RUN_ID:-${SLURM_JOB_ID}}" ...
#
#   CONTINUE                  requeue (default): scontrol requeue, the same job id;
#                             chain: sbatch --dependency=afterany:<this job> of the same
#                             script with the same arguments and environment (TRAIN_RUN_ID
#                             names the run's first job, so the output folder stays)
#   MAX_TIME_LIMIT_RESTARTS   continuations after the time-limit signal (USR2 to this
#                             shell), default 3 (MAX_REQUEUES, its former name, is read too)
#   MAX_PREEMPTIONS           continuations after a preemption (SIGTERM to the step, from
#                             SLURM), default 20
#
# The two kinds are counted apart, as submitit does: a run that cannot finish in its time
# limits stops after a few tries, while preemptions are the site's doing and each costs
# only the steps since the last checkpoint. The counts are lines in a file in the working
# directory, .train-continuations-<run id>, so they hold across requeues and chains.
#
# `scontrol` and `sbatch` run here, in the batch shell on the host: they are rarely inside
# the container. The output directory must stay the same across continuations (runs/<run
# id> does), so that `train --resume auto` finds the checkpoint.
#
# Sourcing this file defines functions only; run_requeueable sets the defaults itself
# (requeue_settings).

# Sets the defaults: train's "requeue me" status (REQUEUE_EXIT_STATUS in
# workload/launch/preemption.py), the caps, the run id and the requeue file. The preempted
# ranks also write that file (REQUEUE_FILE_ENV there): srun --kill-on-bad-exit=1 and
# torchrun do not always pass status 75 on, and its presence tells train that this shell
# continues the run (so train exits instead of waiting for SLURM's own requeue). It lives
# in the working directory, which apptainer binds and the docker form of
# jobs/lib/launch.sh mounts.
requeue_settings() {
  REQUEUE_EXIT_STATUS=75
  CONTINUE=${CONTINUE:-requeue}
  MAX_TIME_LIMIT_RESTARTS=${MAX_TIME_LIMIT_RESTARTS:-${MAX_REQUEUES:-3}}
  MAX_PREEMPTIONS=${MAX_PREEMPTIONS:-20}
  export TRAIN_RUN_ID=${TRAIN_RUN_ID:-${SLURM_JOB_ID:-local}}
  export TRAIN_REQUEUE_FILE=${TRAIN_REQUEUE_FILE:-${PWD}/.train-requeue-${SLURM_JOB_ID:-local}}
  CONTINUATIONS_FILE=${PWD}/.train-continuations-${TRAIN_RUN_ID}
  BATCH_SIGNAL=""
  local name
  for name in CONTINUE MAX_TIME_LIMIT_RESTARTS MAX_PREEMPTIONS TRAIN_RUN_ID; do
    check_setting "${name}"
  done
}

# One line and exit status 2 for a setting this file cannot use.
check_setting() {
  local name=$1 value=${!1}
  case ${name} in
    CONTINUE) [[ ${value} == requeue || ${value} == chain ]] && return 0
              requeue_log "CONTINUE=${value}: expected requeue or chain" ;;
    TRAIN_RUN_ID) [[ ${value} =~ ^[A-Za-z0-9_][A-Za-z0-9_.-]*$ ]] && return 0
                  requeue_log "TRAIN_RUN_ID=${value}: expected a job id such as 12345" ;;
    *) [[ ${value} =~ ^[0-9]{1,6}$ ]] && return 0
       requeue_log "${name}=${value}: expected a whole number, such as 3" ;;
  esac
  exit 2
}

requeue_log() {
  printf 'requeue: %s\n' "$*" >&2
}

# Send the signal on to the step; srun forwards USR2 and TERM to every task.
forward_signal() {
  local signal=$1 pid=$2
  BATCH_SIGNAL=${signal}
  requeue_log "SIG${signal} received: asking the step to checkpoint and stop"
  kill -s "${signal}" "${pid}" 2>/dev/null || true
}

# Wait for the step, however many signals arrive meanwhile; its status in STEP_STATUS.
# (Not through $(...): a subshell cannot wait for this shell's children.)
wait_for_step() {
  local pid=$1
  while true; do
    wait "${pid}" && STEP_STATUS=0 || STEP_STATUS=$?
    # A trapped signal interrupts `wait` (status > 128) while the step still runs.
    kill -0 "${pid}" 2>/dev/null || break
  done
}

# Why the step stopped: the header's time-limit signal reached this shell (USR2), or SLURM
# preempted the job (SIGTERM to the step alone; this shell is not signalled).
continuation_kind() {
  if [[ ${BATCH_SIGNAL} == USR2 ]]; then
    printf 'time-limit\n'
  else
    printf 'preemption\n'
  fi
}

# The batch script's own arguments, NUL-terminated, read from its command line (the
# kernel runs `INTERPRETER [OPTION] SCRIPT ARGUMENTS...`): the words after $0. Inside a
# function "$@" holds the function's arguments, not the script's.
script_arguments() {
  local -a words
  local i
  mapfile -d '' -t words <"/proc/$$/cmdline"
  for ((i = 0; i < ${#words[@]}; i++)); do
    if [[ ${words[i]} == "$0" ]]; then
      ((i + 1 < ${#words[@]})) && printf '%s\0' "${words[@]:i+1}"
      return 0
    fi
  done
}

# The next job of a chain: this script (the copy SLURM runs, $0) with its arguments again,
# after this job ends, submitted as if from the submit directory (this job's SLURM_*
# variables left out, SLURM_CONF kept).
submit_successor() {
  local name
  local -a unset=() arguments
  for name in $(compgen -e); do
    [[ ${name} == SLURM_* && ${name} != SLURM_CONF ]] && unset+=(-u "${name}")
  done
  mapfile -d '' -t arguments < <(script_arguments)
  (cd "${SLURM_SUBMIT_DIR:-.}" && env "${unset[@]}" sbatch --parsable \
    --dependency="afterany:${SLURM_JOB_ID}" "$0" "${arguments[@]}")
}

# Continue the run within the cap of its kind, by requeue or by the next job.
continue_run() {
  local kind cap used next
  kind=$(continuation_kind)
  cap=${MAX_PREEMPTIONS}
  [[ ${kind} == time-limit ]] && cap=${MAX_TIME_LIMIT_RESTARTS}
  used=$(grep -cx "${kind}" "${CONTINUATIONS_FILE}" 2>/dev/null || true)
  used=${used:-0}
  if (( used >= cap )); then
    requeue_log "stopped by ${kind} after ${used} continuations for it, the cap" \
      "(MAX_TIME_LIMIT_RESTARTS=${MAX_TIME_LIMIT_RESTARTS}, MAX_PREEMPTIONS=${MAX_PREEMPTIONS}):" \
      "not requeued; resubmit the same script with TRAIN_RUN_ID=${TRAIN_RUN_ID} to continue" \
      "from the checkpoint"
    exit "${REQUEUE_EXIT_STATUS}"
  fi
  printf '%s\n' "${kind}" >>"${CONTINUATIONS_FILE}"
  if [[ ${CONTINUE} == chain ]]; then
    next=$(submit_successor) || {
      requeue_log "sbatch of the next job failed: resubmit the same script with" \
      "TRAIN_RUN_ID=${TRAIN_RUN_ID} to continue"
      exit "${REQUEUE_EXIT_STATUS}"
    }
    requeue_log "${kind}: continuing run ${TRAIN_RUN_ID} in job ${next}" \
      "($((used + 1)) of ${cap}), after job ${SLURM_JOB_ID} ends"
  else
    requeue_log "${kind}: requeueing job ${SLURM_JOB_ID} ($((used + 1)) of ${cap})"
    scontrol requeue "${SLURM_JOB_ID}"
  fi
  exit 0
}

# Continue the run when the step asked for it; otherwise pass its status on (a finished
# run forgets its counts).
requeue_or_exit() {
  local status=$1
  if [[ -f ${TRAIN_REQUEUE_FILE} ]]; then
    requeue_log "step ended with status ${status}: $(<"${TRAIN_REQUEUE_FILE}")"
    rm -f "${TRAIN_REQUEUE_FILE}"
    status=${REQUEUE_EXIT_STATUS}
  fi
  if (( status == REQUEUE_EXIT_STATUS )); then
    continue_run
  fi
  (( status == 0 )) && rm -f "${CONTINUATIONS_FILE}"
  return "${status}"
}

run_requeueable() {
  local pid
  requeue_settings
  rm -f "${TRAIN_REQUEUE_FILE}"
  "$@" &
  pid=$!
  # shellcheck disable=SC2064  # the pid is fixed now, on purpose
  trap "forward_signal USR2 ${pid}" USR2
  # shellcheck disable=SC2064
  trap "forward_signal TERM ${pid}" TERM
  wait_for_step "${pid}"
  trap - USR2 TERM
  requeue_or_exit "${STEP_STATUS}"
}
