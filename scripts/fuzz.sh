#!/usr/bin/env bash
# The fuzz tier (docs/architecture.md §8): builds the libFuzzer targets of
# tests/fuzz/ with clang, ASan and UBSan into ${DISTRAIN_FUZZ_BUILD_DIR:-build-fuzz}
# (a build of its own: the gcc build in build/ is untouched), then runs each
# for ${DISTRAIN_FUZZ_SECONDS:-30} seconds over its corpus
# tests/fuzz/corpus/<name>/, printing the executions per target. Fails when
# a target crashes, leaks, trips a sanitizer, times out on one input or runs
# out of memory; the input that did it is kept under a temp directory whose
# path is printed. New inputs the fuzzer finds go to that temp directory too,
# never into the repository (copy a crash into the corpus with the fix).
#
#   scripts/fuzz.sh                    build, then run every target
#   scripts/fuzz.sh --build-only       build only
#   scripts/fuzz.sh --seeds            rewrite the generated seeds (fuzz_make_seeds)
#   scripts/fuzz.sh job_yaml ps_wire   run only these targets
#   DISTRAIN_FUZZ_SECONDS=600 scripts/fuzz.sh ps_service   one target, longer
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR="${DISTRAIN_FUZZ_BUILD_DIR:-build-fuzz}"
SECONDS_PER_TARGET="${DISTRAIN_FUZZ_SECONDS:-30}"
CORPUS=tests/fuzz/corpus
TARGETS=(job_yaml job_json tf_config keras_json tfrecord tfrecord_dataset ring_handshake ps_wire
         ps_service ps_worker coordination watch_stream prometheus_text)

BUILD_ONLY=0
SEEDS=0
SELECTED=()
for arg in "$@"; do
  case "$arg" in
    --build-only) BUILD_ONLY=1 ;;
    --seeds) SEEDS=1 ;;
    -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
    -*) echo "fuzz.sh: unknown option '$arg' (see --help)" >&2; exit 2 ;;
    *) SELECTED+=("$arg") ;;
  esac
done
if [ ${#SELECTED[@]} -gt 0 ]; then TARGETS=("${SELECTED[@]}"); fi

if ! command -v clang++ > /dev/null; then
  echo "fuzz.sh: clang++ not found; run scripts/setup.sh (Debian's clang, libclang-rt-14-dev, libomp-14-dev)" >&2
  exit 1
fi
# The same compiler cache as scripts/build.sh (clang's outputs are keyed
# apart from gcc's by the compiler and the flags).
. scripts/ccache_env.sh
LAUNCHER=("${CCACHE_LAUNCHER[@]}")
if [ ! -f "$BUILD_DIR/build.ninja" ]; then
  # No CUDA (the targets are host code; nvcc would not take the sanitizer
  # flags), no tests or benchmarks: only the fuzz targets and their libraries.
  CC=clang CXX=clang++ cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DDISTRAIN_FUZZ=ON -DDISTRAIN_CUDA=OFF -DDISTRAIN_BUILD_TESTS=OFF -DDISTRAIN_BUILD_BENCH=OFF \
    "${LAUNCHER[@]}"
fi
ninja -C "$BUILD_DIR" -j "${DISTRAIN_BUILD_JOBS:-$(nproc)}" fuzz_targets
if [ "$SEEDS" = 1 ]; then
  # The TFRecord seeds come from the MNIST shards scripts/mnist_tfrecord.sh
  # prepares (written by TensorFlow), when they are there.
  shard=$(ls "${DISTRAIN_CACHE:-$HOME/.cache/distrain}"/mnist-*/tfrecord-*/train-00000-of-*.tfrecord.gz 2>/dev/null | head -1 || true)
  "$BUILD_DIR/tests/fuzz/fuzz_make_seeds" "$CORPUS" ${shard:+"$shard"}
  echo "fuzz.sh: seeds written under $CORPUS"
fi
if [ "$BUILD_ONLY" = 1 ] || [ "$SEEDS" = 1 ]; then exit 0; fi

WORK=$(mktemp -d "${TMPDIR:-/tmp}/distrain-fuzz.XXXXXX")
failed=()
start=$(date +%s)
for name in "${TARGETS[@]}"; do
  bin="$BUILD_DIR/tests/fuzz/${name}_fuzz"
  [ -x "$bin" ] || { echo "fuzz.sh: no target '$name' (have: ${TARGETS[*]})" >&2; exit 2; }
  [ -d "$CORPUS/$name" ] || { echo "fuzz.sh: no corpus $CORPUS/$name" >&2; exit 2; }
  mkdir -p "$WORK/$name/new" "$WORK/$name/crash"
  # New inputs go to new/ (first directory); the committed corpus is only read.
  # -rss_limit_mb and -timeout: a request that makes the code allocate
  # gigabytes or spin is a finding too. Leaks are reported by ASan at exit.
  set +e
  TMPDIR="$WORK/$name" "$bin" "$WORK/$name/new" "$CORPUS/$name" \
    -max_total_time="$SECONDS_PER_TARGET" -timeout=10 -rss_limit_mb=2560 -max_len=65536 \
    -artifact_prefix="$WORK/$name/crash/" -print_final_stats=1 > "$WORK/$name/log" 2>&1
  rc=$?
  set -e
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$WORK/$name/log" | tail -1)
  if [ $rc -ne 0 ]; then
    artifact=$(ls "$WORK/$name/crash/"* 2>/dev/null | head -1 || true)
    echo "FAIL $name: exit $rc after ${execs:-?} executions; input: ${artifact:-none}; log: $WORK/$name/log"
    grep -m1 -A12 'ERROR: \|runtime error\|==ERROR' "$WORK/$name/log" || tail -20 "$WORK/$name/log"
    failed+=("$name")
  else
    echo "ok   $name: ${execs:-?} executions in ${SECONDS_PER_TARGET}s"
  fi
done
echo "fuzz.sh: ${#TARGETS[@]} targets in $(( $(date +%s) - start ))s; work directory $WORK"
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz.sh: FAILED: ${failed[*]} (inputs and logs above; keep each as tests/fuzz/corpus/<name>/regression-* with its fix)" >&2
  exit 1
fi
rm -rf "$WORK"
