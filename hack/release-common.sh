# shellcheck shell=bash disable=SC2034  # (variables used by the scripts that source this file)
# hack/release-common.sh — sourced by hack/image.sh and hack/dist.sh (not run on its own).
#
# One place for what both release artifacts agree on: the version (the workspace's), the image
# reference, the Rust target of each os/arch, and how a release binary is built (static where the
# platform allows it, symbols stripped, build paths remapped so the binary does not depend on where
# the checkout or the cargo home lives).
#
# Environment (all optional):
#   CARGO              cargo to run (default: cargo)
#   CARGO_TARGET_DIR   cargo's target dir (default: <repo>/target)
#   IMAGE_REPOSITORY   image repository (default: ghcr.io/kuberly/valkey-operator)
#   SOURCE_DATE_EPOCH  time stamp of archives and the image config (default: the HEAD commit's time)

set -euo pipefail

REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CARGO=${CARGO:-cargo}
TARGET_DIR=${CARGO_TARGET_DIR:-$REPO_ROOT/target}
IMAGE_REPOSITORY=${IMAGE_REPOSITORY:-ghcr.io/kuberly/valkey-operator}
SOURCE_URL=https://github.com/kuberly/valkey-operator
LICENSE_ID=Apache-2.0

rel_log() { printf '[%s] %s\n' "${REL_NAME:-release}" "$*" >&2; }
rel_die() {
  printf '[%s] error: %s\n' "${REL_NAME:-release}" "$*" >&2
  exit 1
}

# The workspace version (the `version` of [workspace.package] in Cargo.toml), e.g. 0.1.0.
workspace_version() {
  awk '
    /^\[/ { section = $0; next }
    section == "[workspace.package]" && $1 == "version" {
      gsub(/"/, "", $3); print $3; exit
    }' "$REPO_ROOT/Cargo.toml"
}
VERSION=$(workspace_version)
[[ $VERSION =~ ^[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.-]+)?$ ]] ||
  rel_die "cannot read a semver version from [workspace.package] in Cargo.toml (got '$VERSION')"
TAG=v$VERSION
IMAGE_REF=$IMAGE_REPOSITORY:$TAG

# Reproducible time stamps of archives and the image: SOURCE_DATE_EPOCH, else the HEAD commit's
# time, else 0. Not exported: build scripts that use cc (ring, psm) rerun, and everything above
# them rebuilds, whenever SOURCE_DATE_EPOCH changes, which would be at every commit.
EPOCH=${SOURCE_DATE_EPOCH:-$(git -C "$REPO_ROOT" log -1 --format=%ct 2>/dev/null || echo 0)}
CREATED=$(date -u -d "@$EPOCH" +%Y-%m-%dT%H:%M:%SZ)
REVISION=$(git -C "$REPO_ROOT" rev-parse HEAD 2>/dev/null || echo unknown)

# krew's usual platforms, in the order they are listed in krew/valkey.yaml.
ALL_PLATFORMS=(linux/amd64 linux/arm64 darwin/amd64 darwin/arm64 windows/amd64 windows/arm64)

# The Rust target triple of an os/arch.
rust_target() {
  case $1 in
    linux/amd64) echo x86_64-unknown-linux-gnu ;;
    linux/arm64) echo aarch64-unknown-linux-gnu ;;
    darwin/amd64) echo x86_64-apple-darwin ;;
    darwin/arm64) echo aarch64-apple-darwin ;;
    windows/amd64) echo x86_64-pc-windows-gnu ;;
    windows/arm64) echo aarch64-pc-windows-gnullvm ;;
    *) return 1 ;;
  esac
}

# How a platform is linked here:
#   native  the host's cc (x86_64 Linux)
#   gcc     a Debian cross gcc (aarch64-linux-gnu-gcc, x86_64-w64-mingw32-gcc)
#   zig     cargo-zigbuild with zig as the C compiler and linker (Windows on arm64; macOS from
#           Linux, which also needs a macOS SDK: see why_not_buildable)
linker_kind() {
  case $1 in
    linux/amd64) [[ $(uname -s)/$(uname -m) == Linux/x86_64 ]] && echo native || echo gcc ;;
    linux/arm64) [[ $(uname -s)/$(uname -m) == Linux/aarch64 ]] && echo native || echo gcc ;;
    windows/amd64) echo gcc ;;
    darwin/*) [[ $(uname -s) == Darwin ]] && echo native || echo zig ;;
    windows/arm64) echo zig ;;
  esac
}

cross_gcc() {
  case $1 in
    linux/amd64) echo x86_64-linux-gnu-gcc ;;
    linux/arm64) echo aarch64-linux-gnu-gcc ;;
    windows/amd64) echo x86_64-w64-mingw32-gcc ;;
  esac
}

# Debian packages that provide cross_gcc.
cross_gcc_packages() {
  case $1 in
    linux/amd64) echo gcc-x86-64-linux-gnu libc6-dev-amd64-cross ;;
    linux/arm64) echo gcc-aarch64-linux-gnu libc6-dev-arm64-cross ;;
    windows/amd64) echo gcc-mingw-w64-x86-64 ;;
  esac
}

# cargo-zigbuild and zig come from PyPI (the cargo-zigbuild wheel depends on ziglang) into a venv.
ZIG_VENV=${VALKEY_OPERATOR_CACHE:-$HOME/.cache/valkey-operator}/tools/zig-venv
zigbuild_available() { [[ -x $ZIG_VENV/bin/cargo-zigbuild && -x $ZIG_VENV/bin/python-zig ]]; }

target_installed() { rustup target list --installed 2>/dev/null | grep -qx "$1"; }

# Why a platform cannot be built here (empty when it can).
why_not_buildable() {
  local platform=$1 target
  target=$(rust_target "$platform") || {
    echo "unknown platform"
    return
  }
  if [[ $target != "$(rustc -vV | sed -n 's/^host: //p')" ]] && ! target_installed "$target"; then
    echo "the Rust standard library for $target is not installed (rustup target add $target)"
    return
  fi
  case $(linker_kind "$platform") in
    gcc)
      command -v "$(cross_gcc "$platform")" >/dev/null ||
        echo "no $(cross_gcc "$platform") (apt-get install $(cross_gcc_packages "$platform"))"
      ;;
    zig)
      if ! zigbuild_available; then
        echo "no cargo-zigbuild/zig in $ZIG_VENV (hack/dist.sh --setup)"
      elif [[ $platform == darwin/* && ! -d ${SDKROOT:-/nonexistent} ]]; then
        # zig brings libSystem but no frameworks; rustls-platform-verifier (kube's TLS) links
        # Security and CoreFoundation. No registry this project may use ships the macOS SDK.
        echo "needs a macOS SDK for the Security and CoreFoundation frameworks (SDKROOT=.../MacOSX.sdk), or a macOS host"
      fi
      ;;
  esac
}

# Installs what building a platform needs: the Rust target, a cross gcc from Debian, or zig.
setup_platform() {
  local platform=$1 target sudo=()
  target=$(rust_target "$platform")
  [[ $(id -u) == 0 ]] || sudo=(sudo -n)
  if [[ $target != "$(rustc -vV | sed -n 's/^host: //p')" ]] && ! target_installed "$target"; then
    rel_log "rustup target add $target"
    rustup target add "$target" || rel_log "could not add $target"
  fi
  case $(linker_kind "$platform") in
    gcc)
      if ! command -v "$(cross_gcc "$platform")" >/dev/null; then
        rel_log "apt-get install $(cross_gcc_packages "$platform")"
        # shellcheck disable=SC2046
        DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y --no-install-recommends \
          $(cross_gcc_packages "$platform") </dev/null || rel_log "could not install a cross gcc"
      fi
      ;;
    zig)
      if ! zigbuild_available; then
        rel_log "installing cargo-zigbuild and zig (PyPI) into $ZIG_VENV"
        if ! { python3 -m venv "$ZIG_VENV" && "$ZIG_VENV/bin/pip" install --quiet cargo-zigbuild </dev/null; }; then
          rel_log "could not install cargo-zigbuild"
        fi
      fi
      ;;
  esac
}

# RUSTFLAGS for one target: static C runtime where the platform has one (a static-pie binary on
# Linux, no libgcc/winpthread DLLs on Windows), symbols stripped, and the checkout and cargo home
# paths remapped (panic locations then read /src/... and /cargo/...).
#
# On Linux, getrandom (0.3, 0.4: the operator's password generator, ahash in kube-runtime, rand in
# the websocket client) is told to call getrandom(2) directly. By default it looks the libc
# function up with dlsym(), which finds nothing in a static binary, and then falls back to reading
# /dev/urandom: the binary would need a /dev it does not otherwise need (tests/packaging.rs runs
# it in a root that has none).
target_rustflags() {
  local target=$1 cargo_home=${CARGO_HOME:-$HOME/.cargo}
  local flags="-C strip=symbols --remap-path-prefix=$REPO_ROOT=/src --remap-path-prefix=$cargo_home=/cargo"
  case $target in
    *-linux-gnu) flags+=' -C target-feature=+crt-static --cfg getrandom_backend="linux_getrandom"' ;;
    *-windows-gnu) flags+=" -C target-feature=+crt-static" ;;
  esac
  echo "$flags"
}

# build_binary PACKAGE BIN PLATFORM: a release build; prints the path of the binary.
build_binary() {
  local package=$1 bin=$2 platform=$3 target var kind why
  target=$(rust_target "$platform") || rel_die "unknown platform $platform"
  why=$(why_not_buildable "$platform")
  [[ -z $why ]] || rel_die "cannot build $platform here: $why"
  var=$(echo "$target" | tr 'a-z-' 'A-Z_')
  kind=$(linker_kind "$platform")
  local envs=("CARGO_TARGET_${var}_RUSTFLAGS=$(target_rustflags "$target")")
  local cmd=("$CARGO" build)
  case $kind in
    gcc)
      envs+=("CARGO_TARGET_${var}_LINKER=$(cross_gcc "$platform")"
        "CC_${target//-/_}=$(cross_gcc "$platform")"
        "AR_${target//-/_}=$(cross_gcc "$platform" | sed 's/gcc$/ar/')")
      ;;
    zig)
      envs+=("PATH=$ZIG_VENV/bin:$PATH")
      cmd=("$ZIG_VENV/bin/cargo-zigbuild" zigbuild)
      ;;
  esac
  rel_log "building $bin for $platform ($target, $kind linker)"
  env "${envs[@]}" CARGO_TARGET_DIR="$TARGET_DIR" "${cmd[@]}" --release --locked \
    --manifest-path "$REPO_ROOT/Cargo.toml" -p "$package" --bin "$bin" --target "$target" >&2
  local exe=$TARGET_DIR/$target/release/$bin
  [[ $platform == windows/* ]] && exe+=.exe
  [[ -f $exe ]] || rel_die "cargo finished but $exe is missing"
  echo "$exe"
}

# Bytes of a file.
file_size() { stat -c %s "$1"; }

# A reproducible tar stream of DIR's contents (sorted, owner root, fixed mtime, no atime/ctime).
repro_tar() {
  local dir=$1
  shift
  tar --create --directory "$dir" --sort=name --owner=0 --group=0 --numeric-owner \
    --mtime="@$EPOCH" --format=posix \
    --pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime "$@"
}
