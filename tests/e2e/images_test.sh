#!/usr/bin/env bash
# e2e.images: builds the worker and operator images with scripts/build-images.sh
# (buildah, a debootstrap'd Debian base, no registry) and runs the binaries in
# them with `buildah run --isolation chroot`:
#   - the image config: user 65532:65532, the binary as entrypoint;
#   - `--version` of distrain-worker, distrain and distrain-operator (the
#     operator is skipped, with a note, while the build has no operator binary);
#   - processes run as uid 65532;
#   - `distrain run` of examples/onedevice.yaml shrunk to 30 steps trains to
#     exit 0 inside the worker image, checkpoints written as uid 65532;
#   - for a CUDA build: the CPU worker image carries no cuBLAS, cuDNN or NCCL,
#     and its worker says so, naming the CUDA image; the worker-cuda image
#     loads all three from /usr/local/lib/distrain (every function the
#     backend calls resolves), and every bundled library finds its
#     dependencies in the image except the driver, which the node mounts.
# Usage: tests/e2e/images_test.sh [BUILD_DIR]   (default: build). Needs root;
# exits 77 (ctest: skipped) without it.
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD_DIR="${1:-${DISTRAIN_BUILD_DIR:-build}}"
TAG=e2e-test
UID_EXPECTED=65532
if [ "$(id -u)" != 0 ]; then
  echo "SKIP: building images needs root (debootstrap, buildah's store)"
  exit 77
fi

fail() { echo "FAIL: $*" >&2; exit 1; }
pass() { echo "ok: $*"; }

start=$SECONDS
images=$(scripts/build-images.sh --build-dir "$BUILD_DIR" --tag "$TAG") ||
  fail "scripts/build-images.sh --build-dir $BUILD_DIR --tag $TAG failed (its messages are above)"
echo "images built in $((SECONDS - start)) s:"; echo "$images"
read -r -a STORAGE <<<"$(scripts/build-images.sh --print-storage)"
B=(buildah "${STORAGE[@]}")

WORKER_IMAGE="localhost/distrain/worker:$TAG"
OPERATOR_IMAGE="localhost/distrain/operator:$TAG"
grep -qx "$WORKER_IMAGE" <<<"$images" || fail "build-images.sh did not report $WORKER_IMAGE"

CONTAINERS=()
TMP=$(mktemp -d)
cleanup() {
  local c
  for c in "${CONTAINERS[@]}"; do "${B[@]}" rm "$c" >/dev/null 2>&1 || true; done
  rm -rf "$TMP"
}
trap cleanup EXIT
new_container() {  # $1: image; sets CTR (not $(...): the cleanup list must see it)
  CTR=$("${B[@]}" from --pull=never "$1") || fail "buildah from $1"
  CONTAINERS+=("$CTR")
}
run_in() {  # $1: container, rest: command
  local c="$1"; shift
  "${B[@]}" run --isolation chroot "$c" -- "$@"
}

check_config() {  # $1: image, $2: entrypoint binary
  local user entrypoint
  user=$("${B[@]}" inspect --type image --format '{{.OCIv1.Config.User}}' "$1")
  [ "$user" = "$UID_EXPECTED:$UID_EXPECTED" ] || fail "$1: config user is '$user', want $UID_EXPECTED:$UID_EXPECTED"
  entrypoint=$("${B[@]}" inspect --type image --format '{{.OCIv1.Config.Entrypoint}}' "$1")
  [ "$entrypoint" = "[$2]" ] || fail "$1: entrypoint is '$entrypoint', want [$2]"
  pass "$1: user $user, entrypoint $entrypoint"
}

check_version() {  # $1: container, $2: binary, $3: expected first word of the output
  local out
  out=$(run_in "$1" "$2" --version 2>&1) || fail "$2 --version failed in the image: $out"
  [[ "$out" == "$3 "* ]] || fail "$2 --version printed '$out', want '$3 <version>'"
  pass "$2 --version: $(head -1 <<<"$out")"
}

check_uid() {  # $1: container, $2: image
  local uid
  uid=$(run_in "$1" id -u) || fail "id -u failed in $2"
  [ "$uid" = "$UID_EXPECTED" ] || fail "$2 runs as uid $uid, want $UID_EXPECTED"
  pass "$2 runs as uid $uid"
}

# --- worker ---------------------------------------------------------------------
check_config "$WORKER_IMAGE" /usr/local/bin/distrain-worker
new_container "$WORKER_IMAGE"; worker="$CTR"
check_version "$worker" /usr/local/bin/distrain-worker distrain-worker
check_version "$worker" distrain distrain
check_uid "$worker" "$WORKER_IMAGE"

# A tiny OneDevice job: the example, shrunk. Every substitution must apply, so a
# changed example fails here instead of silently training 1500 steps.
sed -e 's/^\(    steps:\) 1500$/\1 30/' -e 's/numExamples: 60000$/numExamples: 2000/' \
  -e 's/numEvalExamples: 10000$/numEvalExamples: 500/' -e 's/everySteps: 500$/everySteps: 10/' \
  examples/onedevice.yaml >"$TMP/tiny.yaml"
[ "$(diff examples/onedevice.yaml "$TMP/tiny.yaml" | grep -c '^>')" = 4 ] ||
  fail "examples/onedevice.yaml changed: update the substitutions in $0"
"${B[@]}" copy --chown "$UID_EXPECTED:$UID_EXPECTED" "$worker" "$TMP/tiny.yaml" /home/nonroot/tiny.yaml >/dev/null
rc=0
out=$(run_in "$worker" distrain run --no-progress --checkpoint-dir /home/nonroot/ckpt /home/nonroot/tiny.yaml 2>&1) || rc=$?
[ "$rc" = 0 ] || { echo "$out"; fail "distrain run of the tiny OneDevice job exited $rc in $WORKER_IMAGE"; }
grep -q 'training complete: steps 30 ' <<<"$out" || { echo "$out"; fail "no 'training complete: steps 30' in the output"; }
owners=$(run_in "$worker" sh -c 'stat -c %u /home/nonroot/ckpt/*' | sort -u)
[ "$owners" = "$UID_EXPECTED" ] || fail "checkpoints owned by uid(s) '$owners', want $UID_EXPECTED"
pass "distrain run trained the tiny OneDevice job in $WORKER_IMAGE: $(grep 'training complete' <<<"$out" | sed 's/.*training complete: //')"

# --- worker-cuda ------------------------------------------------------------------
WORKER_CUDA_IMAGE="localhost/distrain/worker-cuda:$TAG"
cpu_version=$(run_in "$worker" distrain-worker --version 2>&1)
if grep -q '^cuda runtime' <<<"$cpu_version"; then
  bundled=$(run_in "$worker" ls /usr/local/lib/distrain)
  ! grep -E 'lib(cublas|cudnn|nccl)' <<<"$bundled" ||
    fail "$WORKER_IMAGE carries CUDA libraries it cannot use: $(tr '\n' ' ' <<<"$bundled")"
  grep -q 'cuda libraries: libcublas.so.13 (cuBLAS.*is not installed here.*worker-cuda' <<<"$cpu_version" ||
    fail "the CPU image's worker does not name the CUDA image for GPUs: $cpu_version"
  pass "$WORKER_IMAGE has no CUDA libraries, and says where they are: $(grep 'cuda libraries' <<<"$cpu_version" | cut -c1-90)..."
  grep -qx "$WORKER_CUDA_IMAGE" <<<"$images" || fail "a CUDA build, but build-images.sh did not report $WORKER_CUDA_IMAGE"
  check_config "$WORKER_CUDA_IMAGE" /usr/local/bin/distrain-worker
  new_container "$WORKER_CUDA_IMAGE"; worker_cuda="$CTR"
  out=$(run_in "$worker_cuda" distrain-worker --version 2>&1) || fail "distrain-worker --version failed in $WORKER_CUDA_IMAGE: $out"
  libs_line=$(grep '^cuda libraries: ' <<<"$out") || fail "no 'cuda libraries' line in: $out"
  for lib in "cuBLAS 13\.[0-9.]* (/usr/local/lib/distrain/libcublas.so.13)" \
             "cuDNN 9\.[0-9.]* (/usr/local/lib/distrain/libcudnn.so.9)" \
             "NCCL 2\.[0-9.]* (/usr/local/lib/distrain/libnccl.so.2)"; do
    grep -q "$lib" <<<"$libs_line" || fail "$WORKER_CUDA_IMAGE: '$lib' not in: $libs_line"
  done
  pass "$WORKER_CUDA_IMAGE: $libs_line"
  unresolved=$(run_in "$worker_cuda" sh -c 'for f in /usr/local/lib/distrain/*; do ldd "$f" | grep "not found" | sed "s|^|$f: |"; done' |
               grep -v -E 'lib(cuda\.so\.1|nvidia-)' || true)
  [ -z "$unresolved" ] || fail "$WORKER_CUDA_IMAGE: bundled libraries with dependencies missing from the image: $unresolved"
  for image in "$WORKER_IMAGE" "$WORKER_CUDA_IMAGE"; do
    echo "size of $image: $("${B[@]}" images --noheading --format '{{.Size}}' "$image" 2>/dev/null || echo ?)"
  done
  pass "$WORKER_CUDA_IMAGE: every bundled library resolves in the image (the driver comes from the node)"
else
  echo "SKIP (worker-cuda only): a CPU-only build has no CUDA image"
fi

# --- operator -------------------------------------------------------------------
if [ -x "$BUILD_DIR/operator/distrain-operator" ]; then
  grep -qx "$OPERATOR_IMAGE" <<<"$images" || fail "build-images.sh did not report $OPERATOR_IMAGE"
  check_config "$OPERATOR_IMAGE" /usr/local/bin/distrain-operator
  new_container "$OPERATOR_IMAGE"; operator="$CTR"
  check_version "$operator" /usr/local/bin/distrain-operator distrain-operator
  check_uid "$operator" "$OPERATOR_IMAGE"
else
  echo "SKIP (operator only): $BUILD_DIR/operator/distrain-operator is not built, so there is no operator image to run"
fi
echo "PASS: images ($((SECONDS - start)) s)"
