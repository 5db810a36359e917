# shellcheck shell=bash
# JSC JUWELS Booster (4 A100 a node, InfiniBand): NCCL's and gloo's sockets on the
# InfiniBand interface. Select it with PRESET=jsc-juwels-booster
# (jobs/sites/jsc-juwels-booster.sbatch does). NOT CONFIRMED on JSC's own pages: we could
# not read them (2026-11-24); ib0 is what JUWELS users' published job scripts set, e.g.
# the NCCL_SOCKET_IFNAME="ib0" of public training scripts for the Booster. Check with
# `ip addr` on a compute node, and NCCL_DEBUG=INFO's "NET/Socket" line.
export NCCL_SOCKET_IFNAME=ib0
export GLOO_SOCKET_IFNAME=ib0
# 3, not 1: with 1 the process aborts before the NCCL flight recorder dump is written
# (https://github.com/pytorch/pytorch/issues/121055).
export TORCH_NCCL_ASYNC_ERROR_HANDLING=3
