#!/usr/bin/env bash
# The README's first command without the install and build steps:
# `scripts/quickstart.sh --no-build` must run a distributed job (the chief
# and the workers of examples/multi-worker-mirrored.yaml, as processes) to
# its last step and exit 0.
#   quickstart_local_test.sh BUILD_DIR
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
BUILD="$(cd "${1:?usage: quickstart_local_test.sh BUILD_DIR}" && pwd)"
out="$(mktemp /tmp/distrain-quickstart-local.XXXXXX)"
trap 'rm -f "$out"' EXIT
DISTRAIN_BUILD_DIR="$BUILD" timeout 300 "$ROOT/scripts/quickstart.sh" --no-build >"$out" 2>&1
rc=$?
failures=0
expect() {
  if grep -Eq "$1" "$out"; then echo "ok: $2"; else echo "FAIL: $2 (no line matching '$1')"; failures=$((failures + 1)); fi
}
[ $rc = 0 ] && echo "ok: quickstart exited 0" || { echo "FAIL: quickstart exited $rc"; failures=$((failures + 1)); }
expect "strategy MultiWorkerMirrored, 4 process\(es\)" "the job is the distributed example, four processes"
expect "task chief:0 strategy MultiWorkerMirrored" "a chief ran"
expect "task worker:2 strategy MultiWorkerMirrored" "three workers ran"
expect "^ +steps +600/600" "every step ran"
expect "^ +exit code +0" "the summary reports success"
if [ $failures != 0 ]; then
  echo "--- quickstart output"
  tail -60 "$out"
fi
exit $((failures != 0))
