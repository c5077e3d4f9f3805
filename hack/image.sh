#!/usr/bin/env bash
# hack/image.sh — the operator's container image, built without a container engine.
#
#   hack/image.sh [--platform P[,P...]] [--binary FILE] [--out DIR]
#       Builds the static valkey-operator binary (unless --binary gives one, single platform only)
#       and assembles a FROM-scratch OCI image around it: one layer holding /valkey-operator and
#       nothing else, user 65532:65532, entrypoint ["/valkey-operator"], cmd ["run"], OCI labels.
#       Writes DIR/image/ (an OCI image layout) and DIR/valkey-operator-vX.Y.Z.oci.tar (the same
#       layout as one tar: `skopeo copy oci-archive:...`, `podman load -i`, `docker load -i`).
#       Default platform linux/amd64, default DIR dist/. Several platforms give a multi-platform
#       image index.
#   hack/image.sh ref
#       Prints the image reference the image is tagged with (what manifests/deployment.yaml uses).
#   hack/image.sh binary PLATFORM FILE
#       Only builds the static binary and copies it to FILE (the Dockerfile's build stage runs this).
#
# The layer tar and every JSON document are written byte for byte the same from the same binary
# and SOURCE_DATE_EPOCH, so the image digest is reproducible. See docs/packaging.md.
set -euo pipefail
REL_NAME=image
# shellcheck source=hack/release-common.sh
source "$(dirname "${BASH_SOURCE[0]}")/release-common.sh"

USER_ID=65532
ENTRYPOINT_JSON='["/valkey-operator"]'
CMD_JSON='["run"]'
ENV_JSON='["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]'
HTTP_PORT=8080

usage() { sed -n '2,19p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }

sha256() { sha256sum "$1" | cut -d' ' -f1; }

# Moves FILE into the layout's blobs and prints its digest.
add_blob() {
  local file=$1 layout=$2 digest
  digest=$(sha256 "$file")
  mv "$file" "$layout/blobs/sha256/$digest"
  echo "$digest"
}

json_labels() {
  printf '{"org.opencontainers.image.created":"%s","org.opencontainers.image.description":"%s","org.opencontainers.image.licenses":"%s","org.opencontainers.image.revision":"%s","org.opencontainers.image.source":"%s","org.opencontainers.image.title":"valkey-operator","org.opencontainers.image.version":"%s"}' \
    "$CREATED" "Kubernetes operator for Valkey" "$LICENSE_ID" "$REVISION" "$SOURCE_URL" "$VERSION"
}

# platform JSON object of an os/arch (arm64 carries the variant v8, as registries expect).
json_platform() {
  local os=${1%/*} arch=${1#*/}
  if [[ $arch == arm64 ]]; then
    printf '{"architecture":"%s","os":"%s","variant":"v8"}' "$arch" "$os"
  else
    printf '{"architecture":"%s","os":"%s"}' "$arch" "$os"
  fi
}

# The deployment's image must be what this script tags (unless the repository was overridden).
check_manifest_ref() {
  local in_manifest
  in_manifest=$(awk '$1 == "image:" { print $2; exit }' "$REPO_ROOT/manifests/deployment.yaml")
  [[ $IMAGE_REF != *:latest ]] || rel_die "refusing to tag the image 'latest'"
  if [[ $in_manifest != "$IMAGE_REF" ]]; then
    if [[ $IMAGE_REPOSITORY == ghcr.io/kuberly/valkey-operator ]]; then
      rel_die "manifests/deployment.yaml references $in_manifest, but the image is tagged $IMAGE_REF (version $VERSION from Cargo.toml): update the manifest"
    fi
    rel_log "note: manifests/deployment.yaml references $in_manifest; this image is $IMAGE_REF"
  fi
}

# Builds one platform's layer, config and manifest into LAYOUT; prints "digest size" of the manifest.
build_platform() {
  local platform=$1 binary=$2 layout=$3 work=$4
  local os=${platform%/*} arch=${platform#*/}
  local rootfs=$work/rootfs-$arch
  rm -rf "$rootfs"
  mkdir -p "$rootfs"
  install -m 0755 "$binary" "$rootfs/valkey-operator"
  if [[ $os == linux ]] && command -v file >/dev/null; then
    file -b "$rootfs/valkey-operator" | grep -q 'static' ||
      rel_die "$binary is not statically linked: $(file -b "$binary")"
  fi

  # The layer: exactly one regular file, owned by root, read-only for the runtime user.
  repro_tar "$rootfs" valkey-operator >"$work/layer.tar"
  local diff_id layer_digest layer_size
  diff_id=$(sha256 "$work/layer.tar")
  gzip -9 -n -c "$work/layer.tar" >"$work/layer.tar.gz"
  layer_size=$(file_size "$work/layer.tar.gz")
  layer_digest=$(add_blob "$work/layer.tar.gz" "$layout")
  echo "$(file_size "$work/layer.tar") $(file_size "$rootfs/valkey-operator")" >"$work/sizes-$arch"

  local config_file=$work/config.json config_digest config_size variant=""
  [[ $arch == arm64 ]] && variant=',"variant":"v8"'
  printf '{"architecture":"%s","created":"%s","os":"%s"%s,"config":{"User":"%s:%s","ExposedPorts":{"%s/tcp":{}},"Env":%s,"Entrypoint":%s,"Cmd":%s,"WorkingDir":"/","Labels":%s,"StopSignal":"SIGTERM"},"rootfs":{"type":"layers","diff_ids":["sha256:%s"]},"history":[{"created":"%s","created_by":"COPY valkey-operator /valkey-operator (hack/image.sh)"}]}' \
    "$arch" "$CREATED" "$os" "$variant" "$USER_ID" "$USER_ID" "$HTTP_PORT" "$ENV_JSON" \
    "$ENTRYPOINT_JSON" "$CMD_JSON" "$(json_labels)" "$diff_id" "$CREATED" >"$config_file"
  config_size=$(file_size "$config_file")
  config_digest=$(add_blob "$config_file" "$layout")

  local manifest_file=$work/manifest.json
  printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:%s","size":%s},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar+gzip","digest":"sha256:%s","size":%s}],"annotations":{"org.opencontainers.image.created":"%s","org.opencontainers.image.source":"%s","org.opencontainers.image.version":"%s"}}' \
    "$config_digest" "$config_size" "$layer_digest" "$layer_size" "$CREATED" "$SOURCE_URL" "$VERSION" \
    >"$manifest_file"
  local manifest_size manifest_digest
  manifest_size=$(file_size "$manifest_file")
  manifest_digest=$(add_blob "$manifest_file" "$layout")
  # For Docker's manifest.json (single-platform images).
  echo "$config_digest $layer_digest" >"$work/docker-$arch"
  echo "$manifest_digest $manifest_size"
}

cmd_build() {
  local platforms=linux/amd64 binary="" out=$REPO_ROOT/dist
  while (($#)); do
    case $1 in
      --platform) platforms=$2; shift 2 ;;
      --platform=*) platforms=${1#*=}; shift ;;
      --binary) binary=$2; shift 2 ;;
      --binary=*) binary=${1#*=}; shift ;;
      --out) out=$2; shift 2 ;;
      --out=*) out=${1#*=}; shift ;;
      -h | --help) usage; exit 0 ;;
      *) usage >&2; exit 2 ;;
    esac
  done
  local -a plats
  IFS=, read -r -a plats <<<"$platforms"
  local p
  for p in "${plats[@]}"; do
    [[ $p == linux/* ]] || rel_die "the image is for Linux only (got $p)"
    rust_target "$p" >/dev/null || rel_die "unknown platform $p"
  done
  [[ -z $binary || ${#plats[@]} == 1 ]] || rel_die "--binary works with a single --platform"
  check_manifest_ref

  mkdir -p "$out"
  out=$(cd "$out" && pwd)
  local layout=$out/image archive=$out/valkey-operator-$TAG.oci.tar
  WORK=$(mktemp -d)
  trap 'rm -rf "$WORK"' EXIT
  local work=$WORK
  rm -rf "$layout"
  mkdir -p "$layout/blobs/sha256"

  local entries=() bin line
  for p in "${plats[@]}"; do
    bin=${binary:-$(build_binary valkey-operator valkey-operator "$p")}
    line=$(build_platform "$p" "$bin" "$layout" "$work")
    entries+=("$(printf '{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:%s","size":%s,"platform":%s}' \
      "${line% *}" "${line#* }" "$(json_platform "$p")")")
  done

  local ref_annotations
  ref_annotations=$(printf '"annotations":{"io.containerd.image.name":"%s","org.opencontainers.image.ref.name":"%s"}' "$IMAGE_REF" "$TAG")
  local top
  if ((${#entries[@]} == 1)); then
    top="${entries[0]%\}},$ref_annotations}"
    # Docker's own archive index, so that older `docker load` versions read the archive too.
    local arch=${plats[0]#*/} cfg layer
    read -r cfg layer <"$work/docker-$arch"
    printf '[{"Config":"blobs/sha256/%s","RepoTags":["%s"],"Layers":["blobs/sha256/%s"]}]' \
      "$cfg" "$IMAGE_REF" "$layer" >"$layout/manifest.json"
  else
    local joined
    joined=$(IFS=,; echo "${entries[*]}")
    printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[%s]}' "$joined" >"$work/index.json"
    local size digest
    size=$(file_size "$work/index.json")
    digest=$(add_blob "$work/index.json" "$layout")
    top=$(printf '{"mediaType":"application/vnd.oci.image.index.v1+json","digest":"sha256:%s","size":%s,%s}' "$digest" "$size" "$ref_annotations")
  fi
  printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[%s]}' "$top" >"$layout/index.json"
  printf '{"imageLayoutVersion":"1.0.0"}' >"$layout/oci-layout"
  # Entries without a leading ./, as `docker save` and skopeo write them.
  local top_entries
  mapfile -t top_entries < <(cd "$layout" && ls -A)
  repro_tar "$layout" "${top_entries[@]}" >"$archive.tmp"
  mv "$archive.tmp" "$archive"
  (cd "$out" && sha256sum "$(basename "$archive")" >"$(basename "$archive").sha256")

  local top_digest
  top_digest=$(sed -n 's/.*"digest":"\(sha256:[0-9a-f]*\)".*/\1/p' "$layout/index.json")
  echo "image:     $IMAGE_REF"
  echo "digest:    $top_digest"
  echo "platforms: ${plats[*]}"
  echo "archive:   $archive ($(file_size "$archive") bytes)"
  echo "layout:    $layout"
  for p in "${plats[@]}"; do
    local sizes
    read -r -a sizes <"$work/sizes-${p#*/}"
    echo "  $p: binary ${sizes[1]} bytes, layer tar (uncompressed rootfs) ${sizes[0]} bytes"
  done
}

case ${1:-} in
  ref) echo "$IMAGE_REF" ;;
  binary)
    [[ $# == 3 ]] || { usage >&2; exit 2; }
    [[ $2 == linux/* ]] || rel_die "the image is for Linux only (got $2)"
    bin=$(build_binary valkey-operator valkey-operator "$2")
    mkdir -p "$(dirname "$3")"
    install -m 0755 "$bin" "$3"
    ;;
  -h | --help | help) usage ;;
  *) cmd_build "$@" ;;
esac
