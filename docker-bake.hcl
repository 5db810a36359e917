# docker-bake.hcl: the hpc-train image in two flavours for GH200 (linux/arm64) and
# A100/H100 (linux/amd64). A flavour is the NGC PyTorch base, nothing else:
#   cuda13  NGC PyTorch 26.02, CUDA 13, R580+ drivers; its torch has the GHSA-63cw-57p8-fm3p fix
#   cuda12  NGC PyTorch 25.06, CUDA 12.9, R5xx drivers (forward compatibility)
#
# Tags (TAG=X.Y.Z):
#   X.Y.Z-cuda13, X.Y.Z         multi-arch, CUDA 13 flavour (the plain tag is CUDA 13)
#   X.Y.Z-cuda12                multi-arch, CUDA 12 flavour
#   X.Y.Z-cuda13-gh200 ...      one architecture: -gh200 (arm64), -a100 (amd64, A100 and H100)
#
#   docker buildx bake                          # default group: both multi-arch flavours
#   docker buildx bake gh200-cuda12 --load      # GH200 only, on an arm64 builder (a Grace node)
#   docker buildx bake a100-cuda13 --load       # A100/H100 only, on an amd64 builder
#   TAG=0.1.0 REVISION=$(git rev-parse HEAD) docker buildx bake --push
#   docker buildx bake --print sites            # show the resolved settings, build nothing
#
# The default group needs a builder with both an arm64 and an amd64 node
# (docker buildx create --append ...) or QEMU emulation, which is slow for pip installs.
# The publish workflow instead builds the four single-arch targets on native runners and
# merges their digests into the multi-arch tags (.github/workflows/publish.yml).

variable "REGISTRY" {
  default = "ghcr.io/hpc-train"
}

variable "IMAGE" {
  default = "hpc-train"
}

# Release tag (X.Y.Z); the targets append -cuda12 / -cuda13 and -gh200 / -a100.
variable "TAG" {
  default = "dev"
}

# NGC PyTorch release of the CUDA 13 flavour (nvcr.io/nvidia/pytorch:CUDA13_BASE_TAG):
# 26.02 or later, the first with torch >= 2.10 (see the Dockerfile for the check).
variable "CUDA13_BASE_TAG" {
  default = "26.02-py3"
}

# NGC PyTorch release of the CUDA 12 flavour: 25.06 (CUDA 12.9), for R5xx drivers older than R580.
variable "CUDA12_BASE_TAG" {
  default = "25.06-py3"
}

# sha256 digests of those bases, recorded in the images' labels (the workflow resolves them).
variable "CUDA13_BASE_DIGEST" {
  default = "unrecorded"
}

variable "CUDA12_BASE_DIGEST" {
  default = "unrecorded"
}

variable "VERSION" {
  default = "0.1.0"
}

variable "REVISION" {
  default = "unknown"
}

variable "CREATED" {
  default = "unknown"
}

# Shared by every target: context, attestations.
target "_common" {
  context    = "."
  dockerfile = "Dockerfile"
  attest = [
    "type=provenance,mode=max",
    "type=sbom",
  ]
}

# OCI labels (set in the Dockerfile from these arguments) and index annotations.
target "_labels" {
  args = {
    VERSION  = "${VERSION}"
    REVISION = "${REVISION}"
    CREATED  = "${CREATED}"
  }
  annotations = [
    "index,manifest:org.opencontainers.image.source=https://github.com/hpc-train/hpc-train",
    "index,manifest:org.opencontainers.image.revision=${REVISION}",
    "index,manifest:org.opencontainers.image.version=${VERSION}",
  ]
}

# The flavours: the base image and its digest.
target "_cuda13" {
  args = {
    BASE_IMAGE  = "nvcr.io/nvidia/pytorch:${CUDA13_BASE_TAG}"
    BASE_DIGEST = "${CUDA13_BASE_DIGEST}"
  }
}

target "_cuda12" {
  args = {
    BASE_IMAGE  = "nvcr.io/nvidia/pytorch:${CUDA12_BASE_TAG}"
    BASE_DIGEST = "${CUDA12_BASE_DIGEST}"
  }
}

# GH200: Grace (arm64) CPU with a Hopper GPU, compute capability 9.0.
target "_gh200" {
  platforms = ["linux/arm64"]
  args      = { CUDA_ARCH = "9.0" }
}

# x86_64 hosts with A100 (Ampere, 8.0) or H100 (Hopper, 9.0) GPUs.
target "_a100" {
  platforms = ["linux/amd64"]
  args      = { CUDA_ARCH = "8.0;9.0" }
}

target "gh200-cuda13" {
  inherits   = ["_common", "_labels", "_cuda13", "_gh200"]
  tags       = ["${REGISTRY}/${IMAGE}:${TAG}-cuda13-gh200"]
  cache-from = ["type=registry,ref=${REGISTRY}/${IMAGE}:buildcache-cuda13-gh200"]
  cache-to   = ["type=registry,ref=${REGISTRY}/${IMAGE}:buildcache-cuda13-gh200,mode=max"]
}

target "a100-cuda13" {
  inherits   = ["_common", "_labels", "_cuda13", "_a100"]
  tags       = ["${REGISTRY}/${IMAGE}:${TAG}-cuda13-a100"]
  cache-from = ["type=registry,ref=${REGISTRY}/${IMAGE}:buildcache-cuda13-a100"]
  cache-to   = ["type=registry,ref=${REGISTRY}/${IMAGE}:buildcache-cuda13-a100,mode=max"]
}

target "gh200-cuda12" {
  inherits   = ["_common", "_labels", "_cuda12", "_gh200"]
  tags       = ["${REGISTRY}/${IMAGE}:${TAG}-cuda12-gh200"]
  cache-from = ["type=registry,ref=${REGISTRY}/${IMAGE}:buildcache-cuda12-gh200"]
  cache-to   = ["type=registry,ref=${REGISTRY}/${IMAGE}:buildcache-cuda12-gh200,mode=max"]
}

target "a100-cuda12" {
  inherits   = ["_common", "_labels", "_cuda12", "_a100"]
  tags       = ["${REGISTRY}/${IMAGE}:${TAG}-cuda12-a100"]
  cache-from = ["type=registry,ref=${REGISTRY}/${IMAGE}:buildcache-cuda12-a100"]
  cache-to   = ["type=registry,ref=${REGISTRY}/${IMAGE}:buildcache-cuda12-a100,mode=max"]
}

# Both architectures of a flavour under one tag in one build. One set of build arguments
# serves both platforms, so CUDA extensions built at run time target 8.0 and 9.0.
target "cuda13" {
  inherits  = ["_common", "_labels", "_cuda13"]
  platforms = ["linux/arm64", "linux/amd64"]
  args      = { CUDA_ARCH = "8.0;9.0" }
  # The plain tag is the CUDA 13 flavour: the torch with the weights-only loader fix.
  tags = ["${REGISTRY}/${IMAGE}:${TAG}-cuda13", "${REGISTRY}/${IMAGE}:${TAG}"]
  cache-from = [
    "type=registry,ref=${REGISTRY}/${IMAGE}:buildcache-cuda13-gh200",
    "type=registry,ref=${REGISTRY}/${IMAGE}:buildcache-cuda13-a100",
  ]
}

target "cuda12" {
  inherits  = ["_common", "_labels", "_cuda12"]
  platforms = ["linux/arm64", "linux/amd64"]
  args      = { CUDA_ARCH = "8.0;9.0" }
  tags      = ["${REGISTRY}/${IMAGE}:${TAG}-cuda12"]
  cache-from = [
    "type=registry,ref=${REGISTRY}/${IMAGE}:buildcache-cuda12-gh200",
    "type=registry,ref=${REGISTRY}/${IMAGE}:buildcache-cuda12-a100",
  ]
}

group "default" {
  targets = ["cuda13", "cuda12"]
}

# The four single-arch images, for sites that pull one architecture by tag.
group "sites" {
  targets = ["gh200-cuda13", "a100-cuda13", "gh200-cuda12", "a100-cuda12"]
}
