# shellcheck shell=bash
# Verbose NCCL and torch.distributed logs, for a job that hangs or fails at start-up.
# Select it with PRESET=debug-nccl. NCCL_DEBUG and NCCL_DEBUG_SUBSYS:
# https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html
export NCCL_DEBUG=INFO
export NCCL_DEBUG_SUBSYS=INIT,NET
export TORCH_DISTRIBUTED_DEBUG=DETAIL
# 3, not 1: with 1 the process aborts before the NCCL flight recorder dump is written
# (https://github.com/pytorch/pytorch/issues/121055).
export TORCH_NCCL_ASYNC_ERROR_HANDLING=3
