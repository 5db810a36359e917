# shellcheck shell=bash
# NCCL over libfabric on HPE Slingshot (CXI), for GH200 systems such as CSCS Alps.
# Select it with PRESET=slingshot-gh200; it assumes the image (or a site module) provides
# the aws-ofi-nccl plugin. Values as CSCS documents them for its PyTorch environment
# (https://docs.cscs.ch/software/communication/nccl/); for Sigma2 Olivia use
# PRESET=sigma2-olivia, which follows Olivia's own page.
export NCCL_NET="AWS Libfabric"        # NCCL's network plugin: libfabric, not sockets
export NCCL_NET_GDR_LEVEL=PHB          # GPUDirect RDMA up to the host bridge
export NCCL_CROSS_NIC=1
export FI_CXI_DISABLE_HOST_REGISTER=1
export FI_MR_CACHE_MONITOR=userfaultfd
export FI_CXI_DEFAULT_CQ_SIZE=131072
export FI_CXI_DEFAULT_TX_SIZE=32768
export FI_CXI_RX_MATCH_MODE=software
export MPICH_GPU_SUPPORT_ENABLED=0     # CUDA-aware MPICH beside NCCL can deadlock
export TORCH_NCCL_ASYNC_ERROR_HANDLING=1
