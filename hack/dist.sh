#!/usr/bin/env bash
# hack/dist.sh — kubectl-valkey release archives, their sha256 sums and the krew manifest.
#
#   hack/dist.sh [--platforms LIST] [--out DIR] [--manifest FILE] [--base-url URL] [--require-all]
#       Builds kubectl-valkey (release, static where the platform allows) for each platform and
#       writes DIR/kubectl-valkey_vX.Y.Z_<os>_<arch>.tar.gz (the binary and LICENSE),
#       DIR/SHA256SUMS, and FILE rendered from krew/valkey.yaml.tmpl with the version, the URIs and
#       the checksums of the archives built.
#         --platforms   comma-separated os/arch list, or `all` (default): krew's usual platforms
#                       linux, darwin, windows x amd64, arm64. With `all`, platforms this machine
#                       cannot build are skipped with the reason; an explicit list must all build.
#         --out         default dist/
#         --manifest    default krew/valkey.yaml
#         --base-url    where the archives are downloaded from (default: the GitHub release of
#                       the tag, https://github.com/kuberly/valkey-operator/releases/download/vX.Y.Z)
#         --require-all fail unless every platform of the list was built (the release workflow)
#   hack/dist.sh --setup [--platforms LIST]
#       Installs what building those platforms needs: rustup targets, Debian's cross gcc
#       (aarch64-linux-gnu, mingw-w64), cargo-zigbuild and zig from PyPI (macOS, Windows arm64).
#   hack/dist.sh --render-only [--platforms LIST] [--out DIR] [--manifest FILE] [--base-url URL] [--require-all]
#       Builds nothing: writes SHA256SUMS and FILE for the archives of this version already in DIR
#       (the release workflow's last step, once every platform's archive has been collected).
#   hack/dist.sh --check-platforms
#       Prints, per platform, whether it can be built here and why not.
set -euo pipefail
REL_NAME=dist
# shellcheck source=hack/release-common.sh
source "$(dirname "${BASH_SOURCE[0]}")/release-common.sh"

usage() { sed -n '2,25p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }

platforms=all out=$REPO_ROOT/dist manifest=$REPO_ROOT/krew/valkey.yaml
base_url=$SOURCE_URL/releases/download/$TAG require_all=0 mode=build
while (($#)); do
  case $1 in
    --platforms) platforms=$2; shift 2 ;;
    --platforms=*) platforms=${1#*=}; shift ;;
    --out) out=$2; shift 2 ;;
    --out=*) out=${1#*=}; shift ;;
    --manifest) manifest=$2; shift 2 ;;
    --manifest=*) manifest=${1#*=}; shift ;;
    --base-url) base_url=$2; shift 2 ;;
    --base-url=*) base_url=${1#*=}; shift ;;
    --require-all) require_all=1; shift ;;
    --setup) mode=setup; shift ;;
    --render-only) mode=render; shift ;;
    --check-platforms) mode=check; shift ;;
    -h | --help) usage; exit 0 ;;
    *) usage >&2; exit 2 ;;
  esac
done
base_url=${base_url%/}

explicit=1
if [[ $platforms == all ]]; then
  explicit=0
  wanted=("${ALL_PLATFORMS[@]}")
else
  IFS=, read -r -a wanted <<<"$platforms"
fi
for p in "${wanted[@]}"; do
  rust_target "$p" >/dev/null || rel_die "unknown platform $p (known: ${ALL_PLATFORMS[*]})"
done

case $mode in
  setup)
    for p in "${wanted[@]}"; do setup_platform "$p"; done
    for p in "${wanted[@]}"; do
      why=$(why_not_buildable "$p")
      printf '%-14s %s\n' "$p" "${why:-buildable}"
    done
    exit 0
    ;;
  check)
    for p in "${wanted[@]}"; do
      why=$(why_not_buildable "$p")
      printf '%-14s %s\n' "$p" "${why:-buildable}"
    done
    exit 0
    ;;
esac

archive_name() { echo "kubectl-valkey_${TAG}_${1%/*}_${1#*/}.tar.gz"; }

[[ -f $REPO_ROOT/LICENSE ]] || rel_die "LICENSE is missing"
mkdir -p "$out" "$(dirname "$manifest")"
out=$(cd "$out" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

built=() skipped=()
for p in "${wanted[@]}"; do
  if [[ $mode == render ]]; then
    name=kubectl-valkey
    [[ $p == windows/* ]] && name+=.exe
    if [[ -f $out/$(archive_name "$p") ]]; then
      echo "$p $name -" >>"$work/built"
      built+=("$p")
    elif ((explicit == 1 || require_all == 1)); then
      rel_die "no archive for $p in $out"
    fi
    continue
  fi
  why=$(why_not_buildable "$p")
  if [[ -n $why ]]; then
    ((explicit == 0 && require_all == 0)) || rel_die "cannot build $p here: $why"
    rel_log "skipping $p: $why"
    skipped+=("$p: $why")
    continue
  fi
  bin=$(build_binary kubectl-valkey kubectl-valkey "$p")
  name=kubectl-valkey
  [[ $p == windows/* ]] && name+=.exe
  stage=$work/${p//\//_}
  mkdir -p "$stage"
  install -m 0755 "$bin" "$stage/$name"
  install -m 0644 "$REPO_ROOT/LICENSE" "$stage/LICENSE"
  repro_tar "$stage" "$name" LICENSE | gzip -9 -n >"$out/$(archive_name "$p").tmp"
  mv "$out/$(archive_name "$p").tmp" "$out/$(archive_name "$p")"
  echo "$p $name $(file_size "$bin")" >>"$work/built"
  built+=("$p")
done
((${#built[@]} > 0)) || rel_die "no platform could be built"

# SHA256SUMS: every archive of this version in DIR, those built now and earlier ones alike.
(cd "$out" && sha256sum -- kubectl-valkey_"${TAG}"_*.tar.gz >SHA256SUMS.tmp && mv SHA256SUMS.tmp SHA256SUMS)

# The krew manifest: the template's platform block once per archive built now, in the order of
# krew's platform list.
render() {
  local template=$REPO_ROOT/krew/valkey.yaml.tmpl p name sha
  local blocks=$work/platforms.yaml
  : >"$blocks"
  for p in "${ALL_PLATFORMS[@]}"; do
    grep -q "^$p " "$work/built" || continue
    name=$(awk -v p="$p" '$1 == p { print $2 }' "$work/built")
    sha=$(sha256sum "$out/$(archive_name "$p")" | cut -d' ' -f1)
    awk '/# END PLATFORM/ { exit } on { print } /# BEGIN PLATFORM/ { on = 1 }' "$template" |
      sed -e "s|@OS@|${p%/*}|g" -e "s|@ARCH@|${p#*/}|g" -e "s|@SHA256@|$sha|g" \
        -e "s|@URI@|$base_url/$(archive_name "$p")|g" -e "s|@BIN@|$name|g" >>"$blocks"
  done
  {
    echo "# Generated by hack/dist.sh (make dist) from krew/valkey.yaml.tmpl: edit the template."
    awk -v blocks="$blocks" '
      NR == 1, !/^#/ { if (/^#/) next }
      /# BEGIN PLATFORM/ { while ((getline line < blocks) > 0) print line; skip = 1; next }
      /# END PLATFORM/ { skip = 0; next }
      !skip { print }' "$template" | sed -e "s|@VERSION@|$TAG|g"
  } >"$manifest.tmp"
  mv "$manifest.tmp" "$manifest"
}
render

echo "version:   $TAG"
echo "archives:  $out"
while read -r p name size; do
  printf '  %-14s %s (%s: %s bytes; archive %s bytes)\n' "$p" "$(archive_name "$p")" "$name" "$size" \
    "$(file_size "$out/$(archive_name "$p")")"
done <"$work/built"
for s in "${skipped[@]}"; do echo "  skipped   $s"; done
echo "checksums: $out/SHA256SUMS"
echo "manifest:  $manifest"
