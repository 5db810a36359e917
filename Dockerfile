# syntax=docker/dockerfile:1
# hpc-train: the training workload on top of NVIDIA's NGC PyTorch image. CUDA, cuDNN,
# NCCL, PyTorch and DALI stay NVIDIA's builds; this file adds the `workload` package, its
# few pure-Python dependencies and entrypoint.sh.
#
#   docker buildx bake gh200          # linux/arm64 (Grace Hopper), see docker-bake.hcl
#   docker buildx bake a100           # linux/amd64 (A100 hosts)
#   docker build -t hpc-train .       # the builder's own architecture
#
# Runs as any user on a read-only root filesystem (Apptainer): caches go under /tmp.

# NGC PyTorch 25.03: CUDA 12.8, Python 3.12, one multi-arch tag for amd64 and arm64
# (NVIDIA's release notes; 25.03 is the first release with /etc/pip/constraint.txt).
# Its digest is NOT recorded here: NGC could not be reached where this file was written,
# so no digest has been verified. Before a release, resolve it with
#   docker buildx imagetools inspect nvcr.io/nvidia/pytorch:25.03-py3
# and pin BASE_IMAGE to name@sha256:... or pass BASE_DIGEST. The publish workflow resolves
# the digest at build time and passes it, so published images carry it in a label.
ARG BASE_IMAGE=nvcr.io/nvidia/pytorch:25.03-py3

FROM ${BASE_IMAGE}

# Re-declared after FROM so the labels below can name the base.
ARG BASE_IMAGE
# Digest of BASE_IMAGE (sha256:...), recorded in a label; filled by bake/CI.
ARG BASE_DIGEST=unrecorded
# Version of this project, for the OCI version label; bake passes the release tag.
ARG VERSION=0.1.0
# Commit the image was built from (git rev-parse HEAD); bake/CI passes it.
ARG REVISION=unknown
# Build time in RFC 3339 (date -u +%Y-%m-%dT%H:%M:%SZ); bake/CI passes it.
ARG CREATED=unknown
# Where the source lives, for the OCI source label.
ARG SOURCE=https://github.com/hpc-train/hpc-train
# GPU architectures for any CUDA extension built at run time (TORCH_CUDA_ARCH_LIST):
# 9.0 for GH200 (Hopper, arm64), 8.0 for A100 (amd64); bake sets one per target.
ARG CUDA_ARCH="8.0;9.0"

SHELL ["/bin/bash", "-o", "pipefail", "-c"]

WORKDIR /opt/hpc-train/src

# Dependencies first, from the metadata alone, so code edits reuse this layer. The script
# keeps the base's torch, torchvision and DALI (NGC's pip constraint file plus one made
# from what the base has installed), adds DALI if the base lacks it, and fails the build
# if torch's version changed.
COPY container/install-workload.sh /opt/hpc-train/
COPY pyproject.toml ./
RUN --mount=type=cache,target=/root/.cache/pip \
    PIP_CACHE_DIR=/root/.cache/pip /opt/hpc-train/install-workload.sh deps .

# The code, installed without dependencies so it cannot touch anything resolved above.
COPY README.md ./
COPY workload ./workload
RUN /opt/hpc-train/install-workload.sh package .

# The entrypoint resolves SLURM/torchrun variables, then execs NGC's own entrypoint
# (CUDA environment, banner), which ends in exec "$@": NGC's setup is chained, not replaced.
COPY entrypoint.sh /usr/local/bin/entrypoint.sh
# The job scripts and the example script travel with the image: copy them out with
# `python -m workload.launch jobs DEST` (docs/your-script.md).
COPY jobs /opt/hpc-train/jobs
COPY examples /opt/hpc-train/examples

# Caches at writable places, so the image runs as any UID with a read-only root and no
# usable HOME (Apptainer, docker run --user --read-only): Triton and Inductor kernels,
# CUDA's JIT cache, DALI's numba operators, matplotlib, pip, torch hub.
ENV TRITON_CACHE_DIR=/tmp/hpc-train-cache/triton \
    TORCHINDUCTOR_CACHE_DIR=/tmp/hpc-train-cache/inductor \
    TORCH_EXTENSIONS_DIR=/tmp/hpc-train-cache/torch_extensions \
    TORCH_HOME=/tmp/hpc-train-cache/torch \
    CUDA_CACHE_PATH=/tmp/hpc-train-cache/nv-compute \
    NUMBA_CACHE_DIR=/tmp/hpc-train-cache/numba \
    MPLCONFIGDIR=/tmp/hpc-train-cache/matplotlib \
    PIP_CACHE_DIR=/tmp/hpc-train-cache/pip \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    TORCH_CUDA_ARCH_LIST=${CUDA_ARCH}

WORKDIR /workspace

LABEL org.opencontainers.image.title="hpc-train" \
      org.opencontainers.image.description="PyTorch training on HPC GPU clusters (GH200, A100), on NVIDIA NGC PyTorch" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="${SOURCE}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.created="${CREATED}" \
      org.opencontainers.image.base.name="${BASE_IMAGE}" \
      org.opencontainers.image.base.digest="${BASE_DIGEST}"

ENTRYPOINT ["/usr/local/bin/entrypoint.sh"]
CMD ["train", "--help"]
