# syntax=docker/dockerfile:1
# hpc-train: the training workload on top of NVIDIA's NGC PyTorch image. CUDA, cuDNN,
# NCCL, PyTorch and DALI stay NVIDIA's builds; this file adds the `workload` package, its
# few pure-Python dependencies and entrypoint.sh.
#
#   docker buildx bake                # both flavours, both architectures (docker-bake.hcl)
#   docker buildx bake gh200-cuda13   # linux/arm64 (Grace Hopper), CUDA 13 flavour
#   docker buildx bake a100-cuda12    # linux/amd64 (A100/H100 hosts), CUDA 12 flavour
#   docker build -t hpc-train .       # the builder's own architecture, CUDA 13 flavour
#
# Runs as any user on a read-only root filesystem (Apptainer): caches go under /tmp.

# Two flavours, which differ only by this base (docker-bake.hcl sets it per target):
#   cuda13 (the default, and the plain X.Y.Z tag): NGC PyTorch 26.02, CUDA 13, for R580+
#     drivers. Chosen because NGC releases before 26.02 ship a torch older than 2.10, and
#     2.10.0 fixes GHSA-63cw-57p8-fm3p (torch.load(weights_only=True) let a crafted
#     checkpoint SETITEM into objects that are not dicts).
#   cuda12: NGC PyTorch 25.06, CUDA 12.9, for R5xx drivers: R575+ natively, older R5xx
#     through CUDA 12 minor-version compatibility and NGC's forward-
#     compatibility libraries on data-centre GPUs (check NVIDIA's 25.06 release notes for
#     the supported branches). Its torch (2.8.0a0) predates that fix: load only
#     checkpoints you trust there.
# NGC ships X.Y.0a0 builds, so check the fix in the image, not by the version number: the
# weights-only unpickler (torch/_weights_only_unpickler.py) must call
# _check_set_item_target before SETITEM/SETITEMS, and refuse a SETITEM on a list:
#   docker run --rm IMAGE python -c "import io, torch._weights_only_unpickler as u; \
#     u.load(io.BytesIO(b'\x80\x02]K\x00aK\x00K\x05s.'))"
# must fail with "UnpicklingError: Can only SETITEM for dict, ..." (an unfixed torch
# prints nothing and returns [5]). NOT VERIFIED HERE: NGC could not be reached where this
# file was written, so neither 26.02's torch source nor either digest has been checked;
# the check above was run only on PyPI's torch 2.14.1 (fixed). Before a release, run it
# in both flavours and resolve the digests with
#   docker buildx imagetools inspect nvcr.io/nvidia/pytorch:26.02-py3
# The publish workflow resolves the digests at build time and passes them (BASE_DIGEST),
# so published images carry them in a label, and it runs the check in each image.
ARG BASE_IMAGE=nvcr.io/nvidia/pytorch:26.02-py3

FROM ${BASE_IMAGE}

# DALI when the base lacks it: auto installs the wheel for the base's CUDA major (none for
# a CPU-only torch), no skips it (container/install-workload.sh).
ARG INSTALL_DALI=auto

SHELL ["/bin/bash", "-o", "pipefail", "-c"]

WORKDIR /opt/hpc-train/src

# Dependencies first, from the metadata alone, so code edits reuse this layer. The script
# keeps the base's torch, torchvision and DALI (NGC's pip constraint file plus one made
# from what the base has installed), adds DALI if the base lacks it, and fails the build
# if torch's version changed. It needs nothing NGC-only: any base with torch builds.
COPY container/install-workload.sh /opt/hpc-train/
COPY pyproject.toml ./
RUN --mount=type=cache,target=/root/.cache/pip \
    PIP_CACHE_DIR=/root/.cache/pip /opt/hpc-train/install-workload.sh deps .

# The code, installed without dependencies so it cannot touch anything resolved above.
# /workspace, the WORKDIR below, is made here: a layered buildah build (podman build's
# default) creates a WORKDIR only when a RUN comes after it, and none does; pyxis and
# Charliecloud start in it.
COPY README.md LICENSE NOTICE ./
COPY workload ./workload
RUN /opt/hpc-train/install-workload.sh package . && mkdir -p /workspace

# The entrypoint resolves SLURM/torchrun variables, then execs NGC's own entrypoint
# (CUDA environment, banner), which ends in exec "$@": NGC's setup is chained, not replaced.
COPY entrypoint.sh /usr/local/bin/entrypoint.sh
# The job scripts and the example script travel with the image: copy them out with
# `python -m workload.launch jobs DEST` (docs/your-script.md).
COPY jobs /opt/hpc-train/jobs
COPY examples /opt/hpc-train/examples

# GPU architectures for any CUDA extension built at run time (TORCH_CUDA_ARCH_LIST):
# 9.0 for GH200 (Hopper, arm64), 8.0;9.0 for A100 and H100 (amd64); bake sets it per target.
ARG CUDA_ARCH="8.0;9.0"

# No cache variable (TRITON_CACHE_DIR, TORCHINDUCTOR_CACHE_DIR, TORCH_HOME, ...) is set
# here: one fixed folder under the host's /tmp, which Apptainer and Charliecloud bind, would
# belong to the first user whose job ran on the node. Each command, setup() and
# entrypoint.sh choose a node-local folder of the user's own at start (workload/caches.py).
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    TORCH_CUDA_ARCH_LIST=${CUDA_ARCH}

WORKDIR /workspace

# The labels' values, declared here and not at the top: every RUN sees the ARGs declared
# before it, so a new REVISION or CREATED (each build has one) would build the layers
# above again instead of reusing them.
# Re-declared after FROM so the labels can name the base.
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
