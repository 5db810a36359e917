#!/usr/bin/env bash
# Container entrypoint: resolve the launch variables, export them, exec the command.
#
# Usage: entrypoint.sh [--] COMMAND [ARGS...]     (entrypoint.sh --help prints this)
#   entrypoint.sh train --dataset digits --device cpu      # one task per GPU (or CPU)
#   entrypoint.sh torchrun --nproc-per-node=4 --no-python train ...   # one task per node
#   entrypoint.sh echo hi                                  # any command runs unchanged
#   entrypoint.sh -- -cmd                                  # `--` ends the script's options
#
# The rules live in Python (`python -m workload.launch env`, see docs/cluster.md, "How
# the variables are resolved"); `train` applies them by itself too, so
# `apptainer exec image train` works without this script. The command is exec'd: it keeps this PID and gets the signals
# SLURM and container engines send. On NGC images we chain to NVIDIA's own entrypoint.
#
# Environment: LAUNCH_PYTHON (python with the workload package; default python3),
# NVIDIA_ENTRYPOINT (default /opt/nvidia/nvidia_entrypoint.sh, used when executable).
set -Eeuo pipefail

err() {
  printf 'entrypoint: %s\n' "$*" >&2
}

# The header above, from "Usage:" to the first blank comment line.
usage() {
  sed -n '/^# Usage:/,/^#$/{/^#$/d;s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}"
}

# Prints the resolved KEY=VALUE lines for COMMAND; exits 2 on a bad value.
resolve_launch() {
  local command=$1 python=${LAUNCH_PYTHON:-python3} resolved
  if ! command -v "${python}" >/dev/null; then
    err "no ${python} on PATH to resolve the launch variables; set LAUNCH_PYTHON"
    exit 2
  fi
  if ! resolved=$("${python}" -m workload.launch env --command="${command}"); then
    err "launch variables could not be resolved (see above); nothing started"
    exit 2
  fi
  printf '%s\n' "${resolved}"
}

# The only variables the resolver prints (EXPORTED_KEYS in workload/launch/__main__.py;
# tests/unit/test_launch_env.py holds the two lists equal). A line for any other name,
# PATH or LD_PRELOAD say, is refused: it cannot come from the resolver.
readonly EXPORTED_KEYS=(
  RANK LOCAL_RANK WORLD_SIZE LOCAL_WORLD_SIZE NODE_RANK MASTER_ADDR MASTER_PORT
  OMP_NUM_THREADS LOCAL_GPU
  PET_NNODES PET_NODE_RANK PET_MASTER_ADDR PET_MASTER_PORT PET_RDZV_BACKEND
  PET_RDZV_ENDPOINT PET_RDZV_ID PET_RDZV_CONF TORCH_DISABLE_SHARE_RDZV_TCP_STORE
  TORCH_FR_BUFFER_SIZE TORCH_NCCL_TRACE_BUFFER_SIZE TORCH_NCCL_DUMP_ON_TIMEOUT
  TORCH_FR_DUMP_TEMP_FILE TORCH_NCCL_DEBUG_INFO_TEMP_FILE TORCH_NCCL_ASYNC_ERROR_HANDLING
  TRITON_CACHE_DIR TORCHINDUCTOR_CACHE_DIR TORCH_EXTENSIONS_DIR TORCH_HOME CUDA_CACHE_PATH
  NUMBA_CACHE_DIR MPLCONFIGDIR PIP_CACHE_DIR HPC_TRAIN_CACHE_ROOT
)

# Exports KEY=VALUE lines read from stdin; comment lines are skipped. No eval: values
# are assigned verbatim (the resolver refuses shell metacharacters and control
# characters), and only to the names of EXPORTED_KEYS.
export_lines() {
  local line key
  while IFS= read -r line; do
    [[ -z ${line} || ${line} == \#* ]] && continue
    key=${line%%=*}
    if [[ ${line} != *=* || " ${EXPORTED_KEYS[*]} " != *" ${key} "* ]]; then
      err "unexpected line from the resolver: ${line}"
      exit 2
    fi
    export "${key}=${line#*=}"
  done
}

main() {
  case ${1-} in
    -h | --help)
      usage
      exit 0
      ;;
    --) shift ;;
    -*)
      err "unknown option $1: entrypoint.sh takes none but --help; put -- before a command that starts with -"
      exit 2
      ;;
  esac
  if (($# == 0)); then
    err "usage: entrypoint.sh COMMAND [ARGS...] (for example: entrypoint.sh train --help)"
    exit 2
  fi
  local resolved
  resolved=$(resolve_launch "$1")
  export_lines <<<"${resolved}"
  local nvidia=${NVIDIA_ENTRYPOINT:-/opt/nvidia/nvidia_entrypoint.sh}
  if [[ -x ${nvidia} ]]; then
    exec "${nvidia}" "$@"
  fi
  exec "$@"
}

if [[ ${BASH_SOURCE[0]} == "$0" ]]; then
  main "$@"
fi
