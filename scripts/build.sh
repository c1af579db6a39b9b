#!/usr/bin/env bash
# Configures and builds distrain into ${DISTRAIN_BUILD_DIR:-build}. Extra
# arguments go to CMake (e.g. -DDISTRAIN_CUDA=OFF).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR="${DISTRAIN_BUILD_DIR:-build}"
# A warm CI run compiles almost nothing: see scripts/ccache_env.sh.
. scripts/ccache_env.sh
LAUNCHER=("${CCACHE_LAUNCHER[@]}")
if [ ${#LAUNCHER[@]} -gt 0 ]; then LAUNCHER+=(-DCMAKE_CUDA_COMPILER_LAUNCHER=ccache); fi
if [ ! -f "$BUILD_DIR/build.ninja" ] || [ $# -gt 0 ]; then
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release "${LAUNCHER[@]}" "$@"
fi
# 2 cores and up to ~1.5 GiB per compile job: one job per core is the sweet spot.
ninja -C "$BUILD_DIR" -j "${DISTRAIN_BUILD_JOBS:-$(nproc)}"
