#!/usr/bin/env bash
# Configures and builds distrain into ${DISTRAIN_BUILD_DIR:-build}. Extra
# arguments go to CMake (e.g. -DDISTRAIN_CUDA=OFF).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR="${DISTRAIN_BUILD_DIR:-build}"
# Compiler outputs are cached across clones under the project cache (ccache,
# installed by scripts/setup.sh), keyed by the preprocessed source and flags;
# paths below the repository are hashed relative to it, so a fresh clone
# anywhere reuses them. A warm CI run then compiles almost nothing.
LAUNCHER=()
if command -v ccache > /dev/null; then
  export CCACHE_DIR="${CCACHE_DIR:-${DISTRAIN_CACHE:-$HOME/.cache/distrain}/ccache}"
  export CCACHE_BASEDIR="$PWD"
  export CCACHE_NOHASHDIR=1
  export CCACHE_MAXSIZE="${CCACHE_MAXSIZE:-4G}"
  LAUNCHER=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache
            -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
fi
if [ ! -f "$BUILD_DIR/build.ninja" ] || [ $# -gt 0 ]; then
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release "${LAUNCHER[@]}" "$@"
fi
# 2 cores and up to ~1.5 GiB per compile job: one job per core is the sweet spot.
ninja -C "$BUILD_DIR" -j "${DISTRAIN_BUILD_JOBS:-$(nproc)}"
