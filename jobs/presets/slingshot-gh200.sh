# shellcheck shell=bash
# NCCL over libfabric on HPE Slingshot (CXI), for GH200 systems such as CSCS Alps.
# Select it with PRESET=slingshot-gh200; it assumes the image (or a site module) provides
# the aws-ofi-nccl plugin. On Alps the Container Engine's AWS OFI NCCL hook sets these
# for you (jobs/sites/cscs-alps.toml); this preset is for the other routes (the uenv,
# another runtime). For Sigma2 Olivia use PRESET=sigma2-olivia, which follows Olivia's page.
#
# Each value as CSCS publishes it, read 2026-11-24:
# https://docs.cscs.ch/software/communication/nccl/ (the "nccl_env_vars" list)
export NCCL_NET="AWS Libfabric"        # fail at start when the plugin is missing, not fall back to TCP
export NCCL_NET_GDR_LEVEL=PHB          # GPUDirect RDMA up to the host bridge
export NCCL_CROSS_NIC=1
# From NCCL 2.27 LL128 is on by default and performs worse on Slingshot (same page).
export NCCL_PROTO=^LL128
export FI_CXI_DEFAULT_CQ_SIZE=131072
export FI_CXI_DEFAULT_TX_SIZE=16384    # an older CSCS PyTorch page had 32768
export FI_CXI_DISABLE_HOST_REGISTER=1
export FI_CXI_RX_MATCH_MODE=software
export FI_MR_CACHE_MONITOR=userfaultfd
# https://docs.cscs.ch/software/ml/pytorch/ (its sbatch script), read 2026-11-24:
export MPICH_GPU_SUPPORT_ENABLED=0     # CUDA-aware MPICH beside NCCL can deadlock
# 3, not the page's 1: with 1 the process aborts before the NCCL flight recorder dump is
# written (https://github.com/pytorch/pytorch/issues/121055); 3 tears down without it.
export TORCH_NCCL_ASYNC_ERROR_HANDLING=3
