#!/usr/bin/env bash
# Publishes one flavour: the per-architecture images under their site tags and a
# multi-arch OCI index under the flavour's tags (docs/images.md), then signs them. The
# publish workflow (.github/workflows/publish.yml) and the registry test
# (tests/e2e/test_image_registry.py) both run this script, so the path users pull from is
# the one the suite exercises.
#
#   tools/release.sh [OPTIONS] REPOSITORY VERSION FLAVOUR amd64=SOURCE arm64=SOURCE
#
#   REPOSITORY  where to push, e.g. ghcr.io/hpc-train/hpc-train or 127.0.0.1:5000/hpc-train
#   VERSION     X.Y.Z or edge;  FLAVOUR  cuda13 or cuda12
#   SOURCE      any skopeo image name: docker://REG/REPO@sha256:... (the workflow's pushes by
#               digest), containers-storage:localhost/IMAGE (the test's local builds)
#   --sign-by FINGERPRINT  GPG simple signing (lookaside signatures, see --registries.d)
#   --cosign               keyless cosign signing of the index and its images (workflow)
#   --registries.d DIR     skopeo's registries.d (where GPG signatures are written)
#   --latest               also tag latest (cuda13 only)
#   --tls-verify=false     plain HTTP (a registry on the loopback interface)
#
# Tags: VERSION-FLAVOUR-a100 (amd64) and VERSION-FLAVOUR-gh200 (arm64), single-arch;
# VERSION-FLAVOUR, and for cuda13 also VERSION (and latest), the multi-arch index. The index
# entries carry the OCI annotations source, revision and version, read from each image's
# labels (the Dockerfile sets them). Layers already in the repository are not sent again,
# so a base shared by every tag is pushed once. The images keep their manifest format (a
# conversion, e.g. to OCI, would make skopeo compress every layer again to learn its
# digest, minutes for a multi-GB base). Prints the index digest last.
set -Eeuo pipefail

err() { echo "release.sh: $*" >&2; }

declare -A SITE=([amd64]=a100 [arm64]=gh200)
ANNOTATED=(org.opencontainers.image.source org.opencontainers.image.revision
  org.opencontainers.image.version)
SIGN_BY="" COSIGN=0 LATEST=0
REGISTRIES_D=() TLS=() SRC_TLS=() DEST_TLS=() WORK=""

usage_error() {
  err "$*"
  err "usage: release.sh [--sign-by FPR | --cosign] [--registries.d DIR] [--latest]" \
    "[--tls-verify=false] REPOSITORY VERSION FLAVOUR amd64=SOURCE arm64=SOURCE"
  exit 2
}

# The flavour's index tags (docs/images.md, "Which tag for my driver").
index_tags() {
  local version="$1" flavour="$2"
  echo "${version}-${flavour}"
  if [[ "${flavour}" == cuda13 ]]; then
    echo "${version}"
    ((LATEST)) && echo latest
  fi
  return 0
}

# Copies one architecture's image to its site tag, then signs it; prints its digest.
push_arch() {
  local source="$1" dest="$2"
  skopeo copy --quiet --multi-arch all --remove-signatures "${DEST_TLS[@]}" --digestfile "${WORK}/digest" \
    "${source}" "docker://${dest}" >&2
  sign_copy "${dest}" "${dest}"
  cat "${WORK}/digest"
}

# Copies a tag within the registry (no layer moves), signed with --sign-by when given.
# Signing in the push itself would make skopeo compress and send every layer again (it
# then skips its cache of what the registry holds): minutes for a multi-GB base.
sign_copy() {
  local from="$1" to="$2" sign=()
  [[ -z "${SIGN_BY}" ]] || sign=(--sign-by "${SIGN_BY}")
  ((${#sign[@]})) || [[ "${from}" != "${to}" ]] || return 0
  skopeo "${REGISTRIES_D[@]}" copy --quiet --multi-arch index-only "${SRC_TLS[@]}" \
    "${DEST_TLS[@]}" "${sign[@]}" "docker://${from}" "docker://${to}" >&2
}

# `podman manifest add` flags: the image's labels named in ANNOTATED as entry annotations.
annotations_of() {
  local ref="$1" key value
  for key in "${ANNOTATED[@]}"; do
    value=$(skopeo inspect "${TLS[@]}" --config "docker://${ref}" \
      | python3 -c "import json, sys; print(json.load(sys.stdin)['config'].get('Labels', {}).get(sys.argv[1], ''))" "${key}")
    [[ -z "${value}" ]] || printf -- '--annotation\n%s=%s\n' "${key}" "${value}"
  done
}

# Pushes the index of the given per-arch digests under every tag; prints its digest.
push_index() {
  local repository="$1" list="$2" arch digest tag first="" flags=()
  shift 2
  podman manifest rm "${list}" >/dev/null 2>&1 || true
  podman manifest create "${list}" >/dev/null
  for arch in amd64 arm64; do
    digest="${DIGESTS[${arch}]}"
    mapfile -t flags < <(annotations_of "${repository}@${digest}")
    podman manifest add "${TLS[@]}" --os linux --arch "${arch}" "${flags[@]}" \
      "${list}" "docker://${repository}@${digest}" >/dev/null
  done
  first="$1"
  podman manifest push --quiet "${TLS[@]}" --all=false --format oci \
    --digestfile "${WORK}/index" "${list}" "docker://${repository}:${first}" >/dev/null
  podman manifest rm "${list}" >/dev/null
  # Every tag, the first included, copied from the first: the manifest bytes (so the
  # digest) stay the same, and each tag gets a signature for its own name.
  for tag in "$@"; do
    sign_copy "${repository}:${first}" "${repository}:${tag}"
  done
  cat "${WORK}/index"
}

parse_options() {
  while (($#)); do
    case "$1" in
      --sign-by) SIGN_BY="${2:?--sign-by needs a GPG key fingerprint}"; shift 2 ;;
      --cosign) COSIGN=1; shift ;;
      --registries.d) REGISTRIES_D=(--registries.d "${2:?--registries.d needs a folder}"); shift 2 ;;
      --latest) LATEST=1; shift ;;
      --tls-verify=false)
        TLS=(--tls-verify=false) SRC_TLS=(--src-tls-verify=false) DEST_TLS=(--dest-tls-verify=false)
        shift ;;
      -*) usage_error "unknown option $1" ;;
      *) ARGS+=("$1"); shift ;;
    esac
  done
}

main() {
  local repository version flavour pair arch index tags=()
  ARGS=()
  declare -gA SOURCES=() DIGESTS=()
  parse_options "$@"
  ((${#ARGS[@]} == 5)) || usage_error "expected 5 arguments, got ${#ARGS[@]}"
  repository="${ARGS[0]}" version="${ARGS[1]}" flavour="${ARGS[2]}"
  [[ "${flavour}" == cuda1[23] ]] || usage_error "FLAVOUR is '${flavour}', expected cuda13 or cuda12"
  for pair in "${ARGS[@]:3}"; do
    arch="${pair%%=*}"
    [[ -n "${SITE[${arch}]:-}" && "${pair}" == *=?* ]] \
      || usage_error "'${pair}' is not amd64=SOURCE or arm64=SOURCE"
    SOURCES[${arch}]="${pair#*=}"
  done
  ((${#SOURCES[@]} == 2)) || usage_error "give both amd64=SOURCE and arm64=SOURCE"
  WORK=$(mktemp -d)
  trap 'rm -rf "${WORK}"' EXIT
  for arch in amd64 arm64; do
    DIGESTS[${arch}]=$(push_arch "${SOURCES[${arch}]}" \
      "${repository}:${version}-${flavour}-${SITE[${arch}]}")
    echo "release.sh: ${repository}:${version}-${flavour}-${SITE[${arch}]} ${DIGESTS[${arch}]}" >&2
  done
  mapfile -t tags < <(index_tags "${version}" "${flavour}")
  index=$(push_index "${repository}" "hpc-train-release-$$" "${tags[@]}")
  echo "release.sh: ${tags[*]/#/${repository}:} ${index}" >&2
  ((COSIGN == 0)) || cosign sign --yes --recursive "${repository}@${index}"
  echo "${index}"
}

main "$@"
