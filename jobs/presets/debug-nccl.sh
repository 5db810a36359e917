# shellcheck shell=bash
# Verbose NCCL and torch.distributed logs, for a job that hangs or fails at start-up.
# Select it with PRESET=debug-nccl.
export NCCL_DEBUG=INFO
export NCCL_DEBUG_SUBSYS=INIT,NET
export TORCH_DISTRIBUTED_DEBUG=DETAIL
export TORCH_NCCL_ASYNC_ERROR_HANDLING=1
