# shellcheck shell=bash
# Preemption and requeue for job scripts: run the training step in the background, pass
# the preemption signal on to it, and requeue the job on the host when train exits with
# the "requeue me" status. Sourced, not run:
#
#   #SBATCH --signal=B:USR2@300   # USR2 to this batch shell 300 s before the time limit
#   #SBATCH --requeue             # the job may be requeued
#   #SBATCH --open-mode=append    # a requeued job appends to the same log
#   source jobs/lib/requeue.sh
#   run_requeueable srun ... train --output-dir "runs/${SLURM_JOB_ID}" ...
#
#   MAX_REQUEUES   requeues allowed, counted with SLURM_RESTART_COUNT (default 3)
#
# `scontrol` runs here, in the batch shell on the host: it is rarely inside the container.
# The output directory must stay the same across requeues (runs/${SLURM_JOB_ID} does: a
# requeued job keeps its id), so that `train --resume auto` finds the checkpoint.
#
# Sourcing this file defines functions only; run_requeueable sets the defaults itself
# (requeue_settings).

# Sets the defaults: train's "requeue me" status (REQUEUE_EXIT_STATUS in
# workload/preemption.py), the cap, and the requeue file. The preempted ranks also write
# that file (REQUEUE_FILE_ENV in workload/preemption.py): srun --kill-on-bad-exit=1 and
# torchrun do not always pass status 75 on. It lives in the working directory, which
# apptainer binds and the docker form of jobs/lib/launch.sh mounts.
requeue_settings() {
  REQUEUE_EXIT_STATUS=75
  MAX_REQUEUES=${MAX_REQUEUES:-3}
  export TRAIN_REQUEUE_FILE=${TRAIN_REQUEUE_FILE:-${PWD}/.train-requeue-${SLURM_JOB_ID:-local}}
}

requeue_log() {
  printf 'requeue: %s\n' "$*" >&2
}

# Send the signal on to the step; srun forwards USR2 and TERM to every task.
forward_signal() {
  local signal=$1 pid=$2
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

# Requeue (up to MAX_REQUEUES) when the step asked for it; otherwise pass its status on.
requeue_or_exit() {
  local status=$1 count=${SLURM_RESTART_COUNT:-0}
  if [[ -f ${TRAIN_REQUEUE_FILE} ]]; then
    requeue_log "step ended with status ${status}: $(<"${TRAIN_REQUEUE_FILE}")"
    rm -f "${TRAIN_REQUEUE_FILE}"
    status=${REQUEUE_EXIT_STATUS}
  fi
  if (( status != REQUEUE_EXIT_STATUS )); then
    return "${status}"
  fi
  if (( count >= MAX_REQUEUES )); then
    requeue_log "preempted after ${count} requeues, the cap (MAX_REQUEUES=${MAX_REQUEUES}):" \
      "not requeued; resubmit the same script to continue from the checkpoint"
    exit "${status}"
  fi
  requeue_log "preempted: requeueing job ${SLURM_JOB_ID} ($((count + 1)) of ${MAX_REQUEUES})"
  scontrol requeue "${SLURM_JOB_ID}"
  exit 0
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
