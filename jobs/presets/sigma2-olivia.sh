# shellcheck shell=bash
# NCCL over libfabric on HPE Slingshot for Sigma2 Olivia (GH200), as Olivia's NCCL page
# asks for them: https://documentation.sigma2.no/hpc_machines/olivia/nccl.html ("NCCL
# runtime configuration"; the values are HPE's, shs-ccl-docs ccl_env.sh). The site's NCCL
# modules set them on the host, and Apptainer passes them into the container
# (https://documentation.sigma2.no/hpc_machines/olivia/nccl_apptainer.html); this preset
# sets them too, so that the job log shows them and a job without the modules (another
# NCCL, another runtime) still gets them. Select it with PRESET=sigma2-olivia; bind the
# site's NCCL stack with jobs/sites/sigma2-olivia-binds.sh (docs/sites/sigma2-olivia.md).
# Values read 2026-11-25 (the page says "At this moment (May 2026)").
#
# Against the LL128 data corruption (GPUDirect in NCCL's LL128 protocol,
# https://github.com/NVIDIA/nccl/issues/2001): the page requires these on Slingshot GH200
# systems; the FI_CXI_RDZV_* lines make libfabric's rendezvous use the alternate read
# protocol with no eager data.
export FI_CXI_RDZV_PROTO=alt_read
export FI_CXI_RDZV_EAGER_SIZE=0
export FI_CXI_RDZV_THRESHOLD=0
export FI_CXI_RDZV_GET_MIN=0
# The rest of the page's list.
export FI_MR_CACHE_MONITOR=userfaultfd
export FI_CXI_DISABLE_HOST_REGISTER=1
export FI_CXI_DEFAULT_CQ_SIZE=131072
export FI_CXI_DEFAULT_TX_SIZE=2048
export FI_CXI_RX_MATCH_MODE=hybrid
export NCCL_CROSS_NIC=1
export NCCL_NET_GDR_LEVEL=PHB
export NCCL_SOCKET_IFNAME=hsn0,hsn1,hsn2,hsn3
export HSA_FORCE_FINE_GRAIN_PCIE=1     # in HPE's list (an AMD ROCm setting; inert on NVIDIA)
# LL128 off: the same page ("Performance considerations": disabling it also avoids the
# corruption), and Olivia's multi-node PyTorch guide runs its container with it
# (https://documentation.sigma2.no/code_development/guides/pytorch_olivia/PyTorchMultiNode.html,
# read 2026-11-25: --env NCCL_PROTO="${NCCL_PROTO:-^LL128}").
export NCCL_PROTO=^LL128
# NCCL's network named: the aws-ofi-nccl plugin the NCCL modules load (the NCCL page) is
# the network "AWS Libfabric" (the name CSCS's NCCL page gives the same plugin:
# https://docs.cscs.ch/software/communication/nccl/). With NCCL_NET set, NCCL uses that
# network or fails at start, instead of falling back to TCP sockets without a word when
# the plugin does not load (CSCS page read 2026-11-24; NCCL_NET: https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html,
# read 2026-12-04 for issue 60).
export NCCL_NET="AWS Libfabric"
