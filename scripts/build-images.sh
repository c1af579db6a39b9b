#!/usr/bin/env bash
# Builds distrain's container images with buildah: no Docker engine, no registry.
#
#   scripts/build-images.sh [--tag T] [--build-dir DIR] [--oci-archive DIR] [--refresh-base] [--no-cuda]
#   scripts/build-images.sh --print-packages     Debian packages the built binaries link (ldd + dpkg -S)
#   scripts/build-images.sh --print-storage      the buildah global flags this script uses here
#   scripts/build-images.sh --base-only          step 1 only; prints the base image's name (for
#                                                images built on it: scripts/build-tf-image.sh)
#   scripts/build-images.sh --print-base         that name only, building nothing
#
#   1. Base: `debootstrap --variant=minbase bookworm` plus RUNTIME_PACKAGES (below)
#      and bookworm's security updates, a user 65532 (nonroot). The rootfs is
#      cached as a tarball under ${DISTRAIN_CACHE:-~/.cache/distrain}/images/,
#      keyed by a hash of the package list and this recipe, and imported as
#      localhost/distrain/base:bookworm-<hash> (also tagged :bookworm).
#   2. localhost/distrain/worker:T   (distrain-worker + distrain) from worker/Containerfile
#   3. localhost/distrain/worker-cuda:T (a CUDA build only; not with --no-cuda)
#      from worker/Containerfile.cuda: the worker image plus cuBLAS, cuDNN (with
#      the sub-libraries libcudnn.so opens at run time, which ldd cannot see)
#      and NCCL, the libraries distrain-worker opens when it finds GPUs
#      (worker/tensor/cuda/cuda_libraries.h). The CPU image does not carry them
#      (~2 GB): the binaries link only the CUDA runtime, statically.
#   4. localhost/distrain/operator:T (distrain-operator) from operator/Containerfile;
#      skipped with a note while the build has no operator binary.
#   Shared libraries the binaries link that no Debian package owns are bundled
#   into the image under /usr/local/lib/distrain. The GPU driver (libcuda)
#   never is: the NVIDIA container toolkit mounts the node's driver into the pod.
#
# Idempotent: with the base cached and imported a rebuild takes seconds (buildah
# reuses unchanged layers). Needs root (debootstrap, buildah storage).
# Storage: kernel overlay in buildah's default store when it mounts here, else
# vfs in /var/lib/containers/storage-vfs (e.g. inside an unprivileged container).
#
# Environment: DISTRAIN_CACHE, DISTRAIN_BUILD_DIR (default build),
#   DISTRAIN_IMAGE_STORAGE_DRIVER=overlay|vfs (skip the probe),
#   DISTRAIN_DEBIAN_MIRROR / DISTRAIN_DEBIAN_SECURITY_MIRROR (default: what apt
#   on this machine uses, else deb.debian.org).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"

# Debian packages of the shared libraries the binaries link, derived with
# `scripts/build-images.sh --print-packages` (ldd on the binaries, dpkg -S on each
# library). Every build checks the binaries against this list and stops with the
# package to add, so it cannot silently drift. Changing it rebuilds the base.
RUNTIME_PACKAGES=(
  libabsl20220623 libbrotli1 libc-ares2 libc6 libcpprest2.10 libdnnl2 libfmt9 libgcc-s1
  libgfortran5 libgomp1 libgrpc++1.51 libgrpc29 libopenblas0-pthread libprotobuf32
  libquadmath0 libre2-9 libspdlog1.10 libssl3 libstdc++6 libyaml-cpp0.7
  ocl-icd-libopencl1  # libdnnl2 links the OpenCL loader; the CPU path never opens a device
  libhdf5-103-1  # the weights file of an exported .keras model, and what it links:
  libaec0 libcom-err2 libcurl4 libffi8 libgmp10 libgnutls30 libgssapi-krb5-2 libhogweed6
  libidn2-0 libk5crypto3 libkeyutils1 libkrb5-3 libkrb5support0 libldap-2.5-0 libnettle8
  libnghttp2-14 libp11-kit0 libpsl5 librtmp1 libsasl2-2 libssh2-1 libsz2 libtasn1-6
  libunistring2 libzstd1
  zlib1g
)
SUITE=bookworm
BASE_RECIPE=3   # bump when build_base_rootfs changes what it produces
NONROOT_UID=65532

TAG=dev
BUILD_DIR=""
OCI_DIR=""
REFRESH_BASE=0
WITH_CUDA=1
MODE=build
while [ $# -gt 0 ]; do
  case "$1" in
    --tag) TAG="${2:?--tag needs a value}"; shift 2 ;;
    --build-dir) BUILD_DIR="${2:?--build-dir needs a value}"; shift 2 ;;
    --oci-archive) OCI_DIR="${2:?--oci-archive needs a directory}"; shift 2 ;;
    --refresh-base) REFRESH_BASE=1; shift ;;
    --no-cuda) WITH_CUDA=0; shift ;;
    --print-packages) MODE=packages; shift ;;
    --print-storage) MODE=storage; shift ;;
    --base-only) MODE=base; shift ;;
    --print-base) MODE=base-name; shift ;;
    -h|--help) sed -n '2,37p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "build-images.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
# --build-dir and --oci-archive are relative to the caller's directory; the
# default build dir, like scripts/build.sh's, to the repository.
[ -z "$BUILD_DIR" ] || BUILD_DIR=$(realpath -m "$BUILD_DIR")
[ -z "$OCI_DIR" ] || OCI_DIR=$(realpath -m "$OCI_DIR")
cd "$ROOT"
BUILD_DIR="${BUILD_DIR:-${DISTRAIN_BUILD_DIR:-build}}"
CACHE="${DISTRAIN_CACHE:-$HOME/.cache/distrain}"
IMAGES_CACHE="$CACHE/images"
# The base's name: a hash of the package list and the recipe (step 1).
KEY=$(printf '%s\n' "$SUITE" "$BASE_RECIPE" $(printf '%s\n' "${RUNTIME_PACKAGES[@]}" | sort) |
      sha256sum | cut -c1-12)
BASE_IMAGE="localhost/distrain/base:$SUITE-$KEY"
if [ "$MODE" = base-name ]; then echo "$BASE_IMAGE"; exit 0; fi
log() { printf '[images] %s\n' "$*" >&2; }
die() { printf 'build-images.sh: %s\n' "$*" >&2; exit 1; }

WORKER_BINS=("$BUILD_DIR/worker/distrain-worker" "$BUILD_DIR/cli/distrain")
OPERATOR_BINS=("$BUILD_DIR/operator/distrain-operator")

# --- shared libraries: Debian-owned (-> package) or bundled -------------------

# Prints "pkg <name>" or "bundle <soname> <path>" per library the given binaries
# load (ldd resolves the whole dependency closure). Fails on a library that does
# not resolve, except the GPU driver's, which the node provides. One dpkg -S for
# all libraries: each call reads the whole package database (~1 s).
classify_libs() {
  local out line name path candidate
  local -a names=() paths=() candidates=()
  local -A owner=()
  out=$(ldd "$@" 2>&1) || die "ldd failed on $*: $out"
  while read -r line; do
    case "$line" in
      *"=> not found"*)
        name="${line%% *}"
        case "$name" in
          libcuda.so*|libnvidia-*) continue ;;
        esac
        die "ldd: $name (needed by one of $*) does not resolve on this machine; install it or fix the build's RPATH"
        ;;
      *" => /"*)
        name="${line%% *}"
        path="${line#* => }"; path="${path%% (*}"
        names+=("$name"); paths+=("$path")
        # dpkg knows a file by the path its package ships, which usrmerge and
        # alternatives may hide behind symlinks.
        candidates+=("$path" "$(readlink -f "$path")" "/usr$path")
        ;;
    esac
  done <<<"$out"
  [ ${#names[@]} -gt 0 ] || return 0
  while IFS= read -r line; do
    [[ "$line" == *": /"* ]] || continue
    owner["${line#*: }"]="${line%%:*}"
  done < <(dpkg -S "${candidates[@]}" 2>/dev/null || true)
  local i pkg
  for i in "${!names[@]}"; do
    pkg=""
    for candidate in "${paths[$i]}" "$(readlink -f "${paths[$i]}")" "/usr${paths[$i]}"; do
      pkg="${owner[$candidate]:-}"
      [ -z "$pkg" ] || break
    done
    if [ -n "$pkg" ]; then echo "pkg $pkg"; else echo "bundle ${names[$i]} ${paths[$i]}"; fi
  done | sort -u
}

existing_bins() {
  local b
  for b in "$@"; do [ -x "$b" ] && echo "$b"; done
  return 0
}

# Stops with the package to add when a binary links a Debian library whose
# package is missing from RUNTIME_PACKAGES.
check_packages() {  # $1: classify_libs output
  local missing=() pkg libs="$1"
  for pkg in $(awk '$1 == "pkg" {print $2}' <<<"$libs"); do
    [[ " ${RUNTIME_PACKAGES[*]} " == *" $pkg "* ]] || missing+=("$pkg")
  done
  [ ${#missing[@]} -eq 0 ] || die "the binaries link libraries from Debian packages that RUNTIME_PACKAGES \
in scripts/build-images.sh lacks: ${missing[*]}. Add them there (the base is then rebuilt)."
}

if [ "$MODE" = packages ]; then
  mapfile -t bins < <(existing_bins "${WORKER_BINS[@]}" "${OPERATOR_BINS[@]}")
  [ ${#bins[@]} -gt 0 ] || die "no binaries in $BUILD_DIR; build first (scripts/build.sh)"
  libs=$(classify_libs "${bins[@]}")
  awk '$1 == "pkg" {print $2}' <<<"$libs" | tr '\n' ' '; echo
  awk '$1 == "bundle" {print "bundled (no Debian package): " $3}' <<<"$libs" >&2
  exit 0
fi

# Checked before anything slow: a library whose package is missing from the
# list must stop the build before the base is made.
WITH_OPERATOR=0
if [ "$MODE" = build ]; then
  for b in "${WORKER_BINS[@]}"; do
    [ -x "$b" ] || die "$b is missing; build first (scripts/build.sh, or pass --build-dir)"
  done
  WORKER_LIBS=$(classify_libs "${WORKER_BINS[@]}")
  check_packages "$WORKER_LIBS"
  # The CUDA image's libraries: the files CMake found for the loader
  # (cmake/DistrainCuda.cmake), what they link that Debian does not provide
  # (cuBLASLt), and every cuDNN sub-library.
  CUDA_LIB_FILES=()
  if [ "$WITH_CUDA" = 1 ]; then
    for var in DISTRAIN_CUBLAS_LIBRARY DISTRAIN_CUDNN_LIBRARY DISTRAIN_NCCL_LIBRARY; do
      f=$(sed -n "s/^$var:FILEPATH=//p" "$BUILD_DIR/CMakeCache.txt" 2>/dev/null)
      [ -n "$f" ] && [ "$f" != "$var-NOTFOUND" ] && [ -e "$f" ] && CUDA_LIB_FILES+=("$f")
    done
    if [ ${#CUDA_LIB_FILES[@]} = 3 ]; then
      cudnn_dir=$(dirname "$(readlink -f "${CUDA_LIB_FILES[1]}")")
      for f in "$cudnn_dir"/libcudnn_*.so.[0-9]*; do
        [[ "$f" == *.so.[0-9] ]] && CUDA_LIB_FILES+=("$f")
      done
    else
      CUDA_LIB_FILES=()   # a CPU-only build: no CUDA image
    fi
  fi
  if [ ${#CUDA_LIB_FILES[@]} -gt 0 ]; then
    CUDA_LIBS=$( (classify_libs "${CUDA_LIB_FILES[@]}"
                  for f in "${CUDA_LIB_FILES[@]}"; do
                    soname=$(readelf -d "$(readlink -f "$f")" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
                    echo "bundle ${soname:-$(basename "$f")} $f"
                  done) | sort -u -k1,2)
    check_packages "$CUDA_LIBS"
  fi
  if [ -x "${OPERATOR_BINS[0]}" ]; then
    WITH_OPERATOR=1
    OPERATOR_LIBS=$(classify_libs "${OPERATOR_BINS[@]}")
    check_packages "$OPERATOR_LIBS"
  fi
fi

# --- buildah storage ----------------------------------------------------------

[ "$(id -u)" = 0 ] || die "needs root (debootstrap and buildah's store); run it with sudo"
command -v buildah >/dev/null && command -v debootstrap >/dev/null ||
  die "buildah and debootstrap are missing; run scripts/setup.sh"

# Overlay in buildah's default store when an overlay mount works here; vfs in a
# store of its own otherwise (a store cannot switch drivers once it has images).
pick_storage() {
  local driver="${DISTRAIN_IMAGE_STORAGE_DRIVER:-}"
  if [ -z "$driver" ]; then
    local ctr
    driver=vfs
    if ctr=$(buildah --storage-driver overlay from --pull=never --name "distrain-probe-$$" scratch 2>/dev/null); then
      buildah --storage-driver overlay mount "$ctr" >/dev/null 2>&1 && driver=overlay
      buildah --storage-driver overlay rm "$ctr" >/dev/null 2>&1 || true
    fi
  fi
  # --layers (reuse unchanged layers) pays on overlay; on vfs every cached step
  # still copies the whole tree, so one container and one commit is faster.
  case "$driver" in
    overlay) BUILDAH_FLAGS=(--storage-driver overlay); LAYERS=true ;;
    vfs) BUILDAH_FLAGS=(--storage-driver vfs --root /var/lib/containers/storage-vfs
                        --runroot /run/containers/storage-vfs); LAYERS=false ;;
    *) die "DISTRAIN_IMAGE_STORAGE_DRIVER='$driver': use overlay or vfs" ;;
  esac
}
pick_storage
if [ "$MODE" = storage ]; then echo "${BUILDAH_FLAGS[*]}"; exit 0; fi
B=(buildah "${BUILDAH_FLAGS[@]}")
image_exists() { "${B[@]}" inspect --type image "$1" >/dev/null 2>&1; }

# --- 1. base --------------------------------------------------------------------

# The mirror apt on this machine uses (deb822 .sources or one-line lists).
apt_mirror() {  # $1: debian | debian-security
  local uri
  uri=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources 2>/dev/null |
        grep -oE "https?://[^ ]+/$1/?( |$)" | head -1 | tr -d ' ' || true)
  echo "${uri:-http://deb.debian.org/$1}"
}

build_base_rootfs() {  # $1: rootfs dir, $2: log file
  local rootfs="$1" blog="$2" mirror security
  mirror="${DISTRAIN_DEBIAN_MIRROR:-$(apt_mirror debian)}"
  security="${DISTRAIN_DEBIAN_SECURITY_MIRROR:-$(apt_mirror debian-security)}"
  log "base: debootstrap --variant=minbase $SUITE from $mirror (a few minutes, once)"
  local include
  include=$(IFS=,; echo "${RUNTIME_PACKAGES[*]}")
  debootstrap --variant=minbase --include="$include" "$SUITE" "$rootfs" "$mirror" \
    >"$blog" 2>&1 || die "debootstrap failed; see $blog"
  # Security and point-release updates, and sources for images that extend this one.
  cat >"$rootfs/etc/apt/sources.list" <<EOF
deb $mirror $SUITE main
deb $mirror $SUITE-updates main
deb $security $SUITE-security main
EOF
  # Images stay small: no docs, man pages or translations, now or when extended.
  cat >"$rootfs/etc/dpkg/dpkg.cfg.d/distrain-nodoc" <<'EOF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
EOF
  cp /etc/resolv.conf "$rootfs/etc/resolv.conf"
  mount -t proc proc "$rootfs/proc"
  local rc=0
  { chroot "$rootfs" apt-get -q update && DEBIAN_FRONTEND=noninteractive chroot "$rootfs" apt-get -q -y upgrade &&
    chroot "$rootfs" apt-get clean; } >>"$blog" 2>&1 || rc=$?
  umount "$rootfs/proc"
  [ "$rc" = 0 ] || die "apt-get upgrade in the base failed; see $blog"
  find "$rootfs/usr/share/doc" -mindepth 2 ! -name copyright ! -type d -delete 2>/dev/null || true
  rm -rf --one-file-system "$rootfs"/usr/share/{man,info,locale}/* "$rootfs"/var/lib/apt/lists/* \
    "$rootfs"/var/cache/apt/*.bin "$rootfs"/var/log/* "$rootfs"/dev/* "$rootfs"/run/* "$rootfs"/tmp/*
  : >"$rootfs/etc/resolv.conf"
  # The runtime user: uid/gid 65532 as in distroless, home for tools that want one.
  echo "nonroot:x:$NONROOT_UID:$NONROOT_UID:nonroot:/home/nonroot:/usr/sbin/nologin" >>"$rootfs/etc/passwd"
  echo "nonroot:x:$NONROOT_UID:" >>"$rootfs/etc/group"
  echo "nonroot:!*:0:0:99999:7:::" >>"$rootfs/etc/shadow"
  install -d -o "$NONROOT_UID" -g "$NONROOT_UID" -m 0750 "$rootfs/home/nonroot"
}

BASE_TAR="$IMAGES_CACHE/base-$SUITE-$KEY.tar.gz"
mkdir -p "$IMAGES_CACHE"
WORK=$(mktemp -d "$IMAGES_CACHE/work.XXXXXX")   # same filesystem as the cache: hard links
cleanup() {
  # Whatever an interrupted debootstrap or upgrade left mounted in the rootfs
  # (proc, sys, a bind-mounted /dev) goes first, deepest first; rm stays on this
  # filesystem in any case so it can never reach into the host's.
  local m
  for m in $(awk -v w="$WORK/" 'index($2, w) == 1 {print $2}' /proc/mounts | sort -r); do
    umount -l "$m" 2>/dev/null || true
  done
  rm -rf --one-file-system "$WORK"
  if [ -n "${CTR:-}" ]; then "${B[@]}" rm "$CTR" >/dev/null 2>&1 || true; fi
}
trap cleanup EXIT

if [ "$REFRESH_BASE" = 1 ]; then
  rm -f "$BASE_TAR"
  "${B[@]}" rmi "$BASE_IMAGE" >/dev/null 2>&1 || true
fi
if image_exists "$BASE_IMAGE"; then
  log "base: $BASE_IMAGE (present)"
else
  if [ -f "$BASE_TAR" ]; then
    log "base: importing cached $BASE_TAR"
  else
    start=$SECONDS
    build_base_rootfs "$WORK/rootfs" "$IMAGES_CACHE/base-$SUITE-$KEY.log"
    tar -C "$WORK/rootfs" --numeric-owner -czf "$BASE_TAR.tmp" .
    mv "$BASE_TAR.tmp" "$BASE_TAR"
    rm -rf --one-file-system "$WORK/rootfs"
    log "base: built and cached in $((SECONDS - start)) s: $BASE_TAR"
  fi
  CTR=$("${B[@]}" from --pull=never scratch)
  "${B[@]}" add "$CTR" "$BASE_TAR" / >/dev/null
  "${B[@]}" config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --cmd /bin/bash --label org.opencontainers.image.base.name="debian:$SUITE (debootstrap minbase)" \
    --label io.distrain.runtime-packages="${RUNTIME_PACKAGES[*]}" "$CTR"
  "${B[@]}" commit --quiet --rm "$CTR" "$BASE_IMAGE" >/dev/null
  CTR=""
  log "base: imported $BASE_IMAGE"
fi
"${B[@]}" tag "$BASE_IMAGE" "localhost/distrain/base:$SUITE"
if [ "$MODE" = base ]; then echo "$BASE_IMAGE"; exit 0; fi

# --- 2, 3. the images -------------------------------------------------------------

# Build context: bin/ (the binaries) and lib/ (shared libraries no Debian package
# provides), hard-linked from the build and the cache where possible.
stage_context() {  # $1: context dir, $2: classify_libs output, rest: binaries
  local ctx="$1" libs="$2" kind name path; shift 2
  mkdir -p "$ctx/bin" "$ctx/lib"
  for path in "$@"; do ln -f "$path" "$ctx/bin/" 2>/dev/null || cp -p "$path" "$ctx/bin/"; done
  while read -r kind name path; do
    [ "$kind" = bundle ] || continue
    path=$(readlink -f "$path")
    ln -f "$path" "$ctx/lib/$name" 2>/dev/null || cp -p "$path" "$ctx/lib/$name"
    log "bundling $name ($(du -h "$path" | cut -f1), no Debian package provides it)"
  done <<<"$libs"
}

EXTRA_BUILD_ARGS=()
build_image() {  # $1: name (worker|worker-cuda|operator), $2: Containerfile, $3: classify_libs output, rest: binaries
  local name="$1" containerfile="$2" libs="$3" image="localhost/distrain/$1:$TAG"; shift 3
  stage_context "$WORK/$name" "$libs" "$@"
  local previous
  previous=$("${B[@]}" inspect --type image --format '{{.FromImageID}}' "$image" 2>/dev/null || true)
  "${B[@]}" bud --quiet --layers="$LAYERS" --pull=never --isolation chroot \
    --build-arg BASE="$BASE_IMAGE" "${EXTRA_BUILD_ARGS[@]}" --label org.opencontainers.image.version="$TAG" \
    -f "$ROOT/$containerfile" -t "$image" "$WORK/$name" >/dev/null
  # The image this tag replaced is now unnamed; drop it so rebuilds do not pile
  # up (on vfs each is a full copy). Fails harmlessly while a container uses it.
  if [ -n "$previous" ] && [ "$previous" != "$("${B[@]}" inspect --type image --format '{{.FromImageID}}' "$image")" ]; then
    "${B[@]}" rmi "$previous" >/dev/null 2>&1 || true
  fi
  echo "$image"
  if [ -n "$OCI_DIR" ]; then
    mkdir -p "$OCI_DIR"
    rm -f "$OCI_DIR/distrain-$name-$TAG.oci.tar"
    "${B[@]}" push --quiet "$image" "oci-archive:$OCI_DIR/distrain-$name-$TAG.oci.tar:$image" >/dev/null
    log "exported $OCI_DIR/distrain-$name-$TAG.oci.tar"
  fi
}

build_image worker worker/Containerfile "$WORKER_LIBS" "${WORKER_BINS[@]}"
if [ ${#CUDA_LIB_FILES[@]} -gt 0 ]; then
  EXTRA_BUILD_ARGS=(--build-arg WORKER="localhost/distrain/worker:$TAG")
  build_image worker-cuda worker/Containerfile.cuda "$CUDA_LIBS"
  EXTRA_BUILD_ARGS=()
elif [ "$WITH_CUDA" = 1 ]; then
  log "worker-cuda image: skipped, $BUILD_DIR is a CPU-only build (no CUDA libraries found by CMake)"
fi
if [ "$WITH_OPERATOR" = 1 ]; then
  build_image operator operator/Containerfile "$OPERATOR_LIBS" "${OPERATOR_BINS[@]}"
else
  log "operator image: skipped, ${OPERATOR_BINS[0]} is not built"
fi
