# docker-bake.hcl: the hpc-train image for GH200 (linux/arm64) and A100 (linux/amd64).
#
#   docker buildx bake                      # default group: one multi-arch tag REGISTRY/IMAGE:TAG
#   docker buildx bake gh200 --load         # GH200 only, on an arm64 builder (a Grace node)
#   docker buildx bake a100 --load          # A100 only, on an amd64 builder
#   TAG=0.1.0 REVISION=$(git rev-parse HEAD) docker buildx bake --push
#   docker buildx bake --print gh200        # show the resolved settings, build nothing
#
# The default group needs a builder with both an arm64 and an amd64 node
# (docker buildx create --append ...) or QEMU emulation, which is slow for pip installs.
# The publish workflow instead builds gh200 and a100 on native runners and merges their
# digests into the one multi-arch tag (.github/workflows/publish.yml).

variable "REGISTRY" {
  default = "ghcr.io/hpc-train"
}

variable "IMAGE" {
  default = "hpc-train"
}

# Tag of the published image; the single-arch targets append -gh200 / -a100.
variable "TAG" {
  default = "dev"
}

# NGC PyTorch release the image extends (nvcr.io/nvidia/pytorch:BASE_TAG), CUDA 12.
variable "BASE_TAG" {
  default = "25.03-py3"
}

# sha256 digest of that base, recorded in the image's labels (the workflow resolves it).
variable "BASE_DIGEST" {
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

# Shared by every target: context, base, attestations, registry build cache.
target "_common" {
  context    = "."
  dockerfile = "Dockerfile"
  args = {
    BASE_IMAGE  = "nvcr.io/nvidia/pytorch:${BASE_TAG}"
    BASE_DIGEST = "${BASE_DIGEST}"
  }
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

# GH200: Grace (arm64) CPU with a Hopper GPU, compute capability 9.0.
target "gh200" {
  inherits   = ["_common", "_labels"]
  platforms  = ["linux/arm64"]
  args       = { CUDA_ARCH = "9.0" }
  tags       = ["${REGISTRY}/${IMAGE}:${TAG}-gh200"]
  cache-from = ["type=registry,ref=${REGISTRY}/${IMAGE}:buildcache-gh200"]
  cache-to   = ["type=registry,ref=${REGISTRY}/${IMAGE}:buildcache-gh200,mode=max"]
}

# A100: x86_64 hosts with Ampere GPUs, compute capability 8.0.
target "a100" {
  inherits   = ["_common", "_labels"]
  platforms  = ["linux/amd64"]
  args       = { CUDA_ARCH = "8.0" }
  tags       = ["${REGISTRY}/${IMAGE}:${TAG}-a100"]
  cache-from = ["type=registry,ref=${REGISTRY}/${IMAGE}:buildcache-a100"]
  cache-to   = ["type=registry,ref=${REGISTRY}/${IMAGE}:buildcache-a100,mode=max"]
}

# Both architectures under one tag in one build. One set of build arguments serves both
# platforms, so CUDA extensions built at run time target 8.0 and 9.0.
target "multiarch" {
  inherits   = ["_common", "_labels"]
  platforms  = ["linux/arm64", "linux/amd64"]
  args       = { CUDA_ARCH = "8.0;9.0" }
  tags       = ["${REGISTRY}/${IMAGE}:${TAG}"]
  cache-from = [
    "type=registry,ref=${REGISTRY}/${IMAGE}:buildcache-gh200",
    "type=registry,ref=${REGISTRY}/${IMAGE}:buildcache-a100",
  ]
}

group "default" {
  targets = ["multiarch"]
}

# The two single-arch images, for sites that pull one architecture by tag.
group "sites" {
  targets = ["gh200", "a100"]
}
