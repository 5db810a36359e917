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
#   MAX_ATTEMPTS_WITHOUT_PROGRESS  with a decision (below): attempts in a row that wrote
#                             no new checkpoint after which the run stops, default 3
#   MIN_NODES                 with a decision: the fewest nodes a failed step may go on
#                             with inside the allocation (default: never fewer)
#   MAX_TIME_LIMIT_RESTARTS   continuations after the time-limit signal (USR2 to this
#                             shell); default: none with a decision, else 3 (MAX_REQUEUES,
#                             its former name, is read too)
#   MAX_PREEMPTIONS           continuations after a preemption (SIGTERM to the step, from
#                             SLURM); default: none with a decision, else 20
#
# The decision (docs/failures.md): when DECIDE holds a command (jobs/lib/launch.sh sets it
# to `diagnose RUN_DIR` in the step's image; a script of your own may set it too), this
# shell runs it after every step with what it saw (the status, train's requeue request,
# the time-limit signal, the nodes) and does what it prints: done, restart the step here
# (on the nodes it names: jobs/lib/launch.sh's step_for_nodes moves the step; without it
# the same command runs again), shrink (the same on fewer nodes), requeue (or chain),
# leaving the nodes it names behind (ExcNodeList, --exclude), or stop. It stops a run whose
# attempts write no new checkpoint, so fixed caps are not needed; set one and it holds.
# Without DECIDE (or when the decision cannot run), status 75 or the requeue file
# continues the run within the caps and any other status passes through.
#
# The caps' kinds are counted apart, as submitit does: a run that cannot finish in its time
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
  MAX_TIME_LIMIT_RESTARTS=${MAX_TIME_LIMIT_RESTARTS:-${MAX_REQUEUES:-}}
  MAX_PREEMPTIONS=${MAX_PREEMPTIONS:-}
  MAX_ATTEMPTS_WITHOUT_PROGRESS=${MAX_ATTEMPTS_WITHOUT_PROGRESS:-3}
  MIN_NODES=${MIN_NODES:-0}
  export TRAIN_RUN_ID=${TRAIN_RUN_ID:-${SLURM_JOB_ID:-local}}
  export TRAIN_REQUEUE_FILE=${TRAIN_REQUEUE_FILE:-${PWD}/.train-requeue-${SLURM_JOB_ID:-local}}
  CONTINUATIONS_FILE=${PWD}/.train-continuations-${TRAIN_RUN_ID}
  BATCH_SIGNAL=""
  STEP_PID=""
  [[ $(declare -p DECIDE 2>/dev/null) == "declare -a"* ]] || DECIDE=()
  local name
  for name in CONTINUE MAX_TIME_LIMIT_RESTARTS MAX_PREEMPTIONS MAX_ATTEMPTS_WITHOUT_PROGRESS \
    MIN_NODES TRAIN_RUN_ID; do
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
    MAX_TIME_LIMIT_RESTARTS | MAX_PREEMPTIONS)  # empty: no fixed cap (see cap_of)
       [[ ${value} =~ ^[0-9]{0,6}$ ]] && return 0
       requeue_log "${name}=${value}: expected a whole number, such as 3" ;;
    MAX_ATTEMPTS_WITHOUT_PROGRESS) [[ ${value} =~ ^[1-9][0-9]{0,5}$ ]] && return 0
       requeue_log "${name}=${value}: expected a whole number of 1 or more, such as 3" ;;
    *) [[ ${value} =~ ^[0-9]{1,6}$ ]] && return 0
       requeue_log "${name}=${value}: expected a whole number, such as 3" ;;
  esac
  exit 2
}

requeue_log() {
  printf 'requeue: %s\n' "$*" >&2
}

# Send the signal on to the step running now (none while the decision runs: the one
# after it requeues instead of restarting); srun forwards USR2 and TERM to every task.
forward_signal() {
  local signal=$1
  BATCH_SIGNAL=${signal}
  requeue_log "SIG${signal} received: asking the step to checkpoint and stop"
  [[ -n ${STEP_PID} ]] && kill -s "${signal}" "${STEP_PID}" 2>/dev/null || true
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

# Why the step stopped: the header's time-limit signal reached this shell (USR2), SLURM
# preempted the job (SIGTERM to the step alone; this shell is not signalled), or it failed
# and the decision sends the run through the queue.
continuation_kind() {
  if [[ ${ACTION_KIND:-} == failure ]]; then
    printf 'failure\n'
  elif [[ ${BATCH_SIGNAL} == USR2 ]]; then
    printf 'time-limit\n'
  else
    printf 'preemption\n'
  fi
}

# The cap of a kind of continuation: the one set; without one, none where a decision
# watches the run's progress, else the former defaults (3 time limits, 20 preemptions).
cap_of() {
  local kind=$1 value=""
  case ${kind} in
    time-limit) value=${MAX_TIME_LIMIT_RESTARTS}; ((${#DECIDE[@]})) || value=${value:-3} ;;
    preemption) value=${MAX_PREEMPTIONS}; ((${#DECIDE[@]})) || value=${value:-20} ;;
  esac
  printf '%s\n' "${value}"
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
    ${EXCLUDE:+"--exclude=${EXCLUDE}"} --dependency="afterany:${SLURM_JOB_ID}" "$0" \
    "${arguments[@]}")
}

# The requeued job starts on none of the nodes left behind: its ExcNodeList. SLURM takes
# it only from a pending job ("Job is no longer pending execution" for a running one,
# 22.05), and a requeued job is pending at once (while it completes, this shell still
# alive: SLURM's SIGTERM is trapped here, SIGKILL comes KillWait later) and held back for
# the credential lifetime before it may start: so requeue first, then exclude.
# The job turns pending a moment after `scontrol requeue` returns: tried for 5 s.
requeue_job() {
  local try
  scontrol requeue "${SLURM_JOB_ID}"
  [[ -n ${EXCLUDE:-} ]] || return 0
  for try in {1..20}; do
    if scontrol update "JobId=${SLURM_JOB_ID}" "ExcNodeList=${EXCLUDE}" 2>/dev/null; then
      requeue_log "leaving ${EXCLUDE} behind: excluded from the requeued job"
      return 0
    fi
    sleep 0.25
  done
  requeue_log "scontrol update ExcNodeList=${EXCLUDE} failed ${try} times: the requeued" \
    "job may land there again"
}

# Continue the run within the cap of its kind, by requeue or by the next job.
continue_run() {
  local kind cap used next of
  kind=$(continuation_kind)
  cap=$(cap_of "${kind}")
  used=$(grep -cx "${kind}" "${CONTINUATIONS_FILE}" 2>/dev/null || true)
  used=${used:-0}
  of="$((used + 1))${cap:+ of ${cap}}"
  if [[ -n ${cap} ]] && (( used >= cap )); then
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
      "(${of}), after job ${SLURM_JOB_ID} ends"
  else
    requeue_log "${kind}: requeueing job ${SLURM_JOB_ID} (${of})"
    requeue_job
  fi
  exit 0
}

# Without a decision: the step's request (status 75 or the requeue file) continues the
# run, any other status passes through.
decide_without_command() {
  local status=$1
  ACTION=pass NEXT_NODES="" EXCLUDE=""
  if [[ -n ${ASKED} ]] || (( status == REQUEUE_EXIT_STATUS )); then
    ACTION=requeue
  elif (( status == 0 )); then
    ACTION="done"
  fi
}

# Nodes of this job that SLURM says are down, drained or failing (comma-separated).
down_nodes() {
  [[ -n ${SLURM_JOB_NODELIST:-} ]] || return 0
  sinfo -h -N -n "${SLURM_JOB_NODELIST}" -t down,drain,fail,no_respond -o %N 2>/dev/null |
    sort -u | paste -sd, - || true
}

# Reads the decision's key=value lines (never evaluated: each value checked) into ACTION,
# NEXT_NODES and EXCLUDE; status 1 for anything else.
read_decision() {
  local line key value
  ACTION="" NEXT_NODES="" EXCLUDE=""
  while IFS= read -r line; do
    key=${line%%=*} value=${line#*=}
    [[ ${value} =~ ^[A-Za-z0-9._,-]*$ ]] || return 1
    case ${key} in
      action) [[ ${value} =~ ^(done|restart|shrink|requeue|stop)$ ]] || return 1
              ACTION=${value} ;;
      nodes) NEXT_NODES=${value} ;;
      exclude) EXCLUDE=${value} ;;
    esac
  done <"$1"
  [[ -n ${ACTION} ]]
}

# The decision after the step (DECIDE, see the header) into ACTION, NEXT_NODES, EXCLUDE;
# without DECIDE, or when it fails, decide_without_command.
decide_after_step() {
  local status=$1 answer
  local -a seen=()
  if ((${#DECIDE[@]} == 0)); then
    decide_without_command "${status}"
    return
  fi
  [[ ${BATCH_SIGNAL} == USR2 ]] && seen+=(--time-limit)
  answer=$(mktemp)
  # NAME=VALUE: a value that starts with '-' is still the value.
  if "${DECIDE[@]}" --after-step="${status}" --job="${SLURM_JOB_ID:-local}" \
    --requeue-asked="${ASKED}" "${seen[@]}" --allocation="${SLURM_JOB_NODELIST:-}" \
    --step-nodes="${STEP_NODES:-}" --down="$(down_nodes)" --min-nodes="${MIN_NODES}" \
    --max-without-progress="${MAX_ATTEMPTS_WITHOUT_PROGRESS}" >"${answer}" &&
    read_decision "${answer}"; then
    rm -f "${answer}"
    return
  fi
  rm -f "${answer}"
  requeue_log "the decision after the step (${DECIDE[*]}) failed: the step's status decides"
  decide_without_command "${status}"
}

# doctor's preflight (PREFLIGHT_STEP: jobs/lib/launch.sh sets it with PREFLIGHT=1), then
# the decision on its report: the unfit nodes recorded and left out of the first step (a
# spare in their place, or fewer nodes where MIN_NODES allows), or, with too few left,
# the job requeued without them. doctor's own status is not the decision's: a check that
# fails on every node is the job's setting, which train then names itself.
run_preflight() {
  local answer status=0
  ((${#PREFLIGHT_STEP[@]} && ${#DECIDE[@]})) || return 0
  rm -f "${TRAIN_PREFLIGHT_REPORT}"
  "${PREFLIGHT_STEP[@]}" || status=$?
  requeue_log "doctor's preflight ended with status ${status}"
  answer=$(mktemp)
  if "${DECIDE[@]}" --preflight="${TRAIN_PREFLIGHT_REPORT}" --job="${SLURM_JOB_ID:-local}" \
    --allocation="${SLURM_JOB_NODELIST:-}" --step-nodes="${STEP_NODES:-}" \
    --min-nodes="${MIN_NODES}" >"${answer}" && read_decision "${answer}"; then
    rm -f "${answer}"
    case ${ACTION} in
      restart | shrink) next_step ;;
      requeue) ACTION_KIND=failure; continue_run ;;
    esac
    return 0
  fi
  rm -f "${answer}"
  requeue_log "doctor's preflight gave no decision (${DECIDE[*]}): the step runs where it was"
}

# Runs the step in the background, passing this shell's signals on; its status in
# STEP_STATUS, train's requeue request (the file's line) in ASKED.
run_step() {
  rm -f "${TRAIN_REQUEUE_FILE}"
  "$@" &
  STEP_PID=$!
  wait_for_step "${STEP_PID}"
  STEP_PID=""
  ASKED=""
  if [[ -f ${TRAIN_REQUEUE_FILE} ]]; then
    ASKED=$(<"${TRAIN_REQUEUE_FILE}")
    requeue_log "step ended with status ${STEP_STATUS}: ${ASKED}"
    rm -f "${TRAIN_REQUEUE_FILE}"
  fi
}

# The next step's command into STEP: on NEXT_NODES where the job script can move it
# (jobs/lib/launch.sh's step_for_nodes), else the same command again.
next_step() {
  if [[ -n ${NEXT_NODES} ]] && declare -F step_for_nodes >/dev/null; then
    step_for_nodes "${NEXT_NODES}"
  fi
}

# Does what the decision said: status 0 to run the step again, 1 when the run is done
# here (its status in FINAL_STATUS); a requeue or a stop ends this shell.
obey_decision() {
  local status=$1
  ACTION_KIND=""
  if [[ ${ACTION} == restart || ${ACTION} == shrink ]] && [[ -n ${BATCH_SIGNAL} ]]; then
    ACTION=requeue  # the allocation is ending: a restart here would be cut short
  fi
  case ${ACTION} in
    restart | shrink)
      # The step before ended: its run lock (on a node lost, maybe) is stale.
      export TRAIN_PREVIOUS_STEP_ENDED=1
      next_step
      return 0 ;;
    requeue) (( status == REQUEUE_EXIT_STATUS )) || [[ -n ${ASKED} ]] || ACTION_KIND=failure
             continue_run ;;
    stop) requeue_log "stopped: not continued (${DECIDE[*]:-diagnose RUN_DIR} shows the" \
            "attempts)"
          exit $(( status == 0 ? 1 : status )) ;;
    done) rm -f "${CONTINUATIONS_FILE}"; FINAL_STATUS=0 ;;
    *) FINAL_STATUS=${status} ;;  # no decision: a failure passes through
  esac
  return 1
}

# Runs the step, then what the decision after it says, until the run is done, requeued
# or stopped. STEP (the command) is replaced by step_for_nodes when the step moves.
run_requeueable() {
  requeue_settings
  STEP=("$@")
  trap "forward_signal USR2" USR2
  trap "forward_signal TERM" TERM
  [[ $(declare -p PREFLIGHT_STEP 2>/dev/null) == "declare -a"* ]] || PREFLIGHT_STEP=()
  run_preflight
  while true; do
    run_step "${STEP[@]}"
    decide_after_step "${STEP_STATUS}"
    obey_decision "${STEP_STATUS}" || break
  done
  trap - USR2 TERM
  return "${FINAL_STATUS}"
}
