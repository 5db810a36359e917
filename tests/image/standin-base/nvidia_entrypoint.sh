#!/usr/bin/env bash
# Stand-in for NGC's /opt/nvidia/nvidia_entrypoint.sh. The real one prints a banner and
# sets up the CUDA environment, then ends in exec "$@". This one leaves a marker that
# tests read to prove the project's entrypoint chained to it.
set -Eeuo pipefail

export NGC_STANDIN_ENTRYPOINT_RAN=1
if (($# == 0)); then
  exec /bin/bash
fi
exec "$@"
