#!/usr/bin/env bash
# e2e: `scripts/quickstart.sh --kube` — the README's whole-user-path command —
# runs as documented and prints the result: the chart installed, the operator
# pod leading, the OneDevice example's `kubectl get dtj` row reaching
# Succeeded, the chief's final accuracy line, and "--- onedevice: Succeeded".
#   tests/e2e/with_node.sh bash tests/e2e/quickstart_kube_test.sh BUILD_DIR
# Runs with --no-build against BUILD_DIR. Needs root; skips (exit 77) otherwise.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BUILD="$(cd "${1:?usage: quickstart_kube_test.sh BUILD_DIR}" && pwd)"
if [ "$(id -u)" != 0 ]; then
  echo "SKIP: quickstart --kube needs root (the real node: namespaces, mounts, cgroups, iptables)"
  exit 77
fi
out="$(mktemp /tmp/distrain-quickstart-kube.XXXXXX)"
trap 'rm -f "$out"' EXIT
start=$SECONDS
DISTRAIN_QUICKSTART_TIMEOUT="${DISTRAIN_QUICKSTART_TIMEOUT:-300}" DISTRAIN_BUILD_DIR="$BUILD" \
  "$ROOT/scripts/quickstart.sh" --kube --no-build >"$out" 2>&1
rc=$?
failures=0
expect() {  # expect REGEX WHAT
  grep -Eq -- "$1" "$out" && echo "ok: $2" || { echo "FAIL: the output lacks $2 (/$1/)"; failures=$((failures + 1)); }
}
[ $rc = 0 ] && echo "ok: quickstart --kube exited 0" || { echo "FAIL: quickstart --kube exited $rc"; failures=$((failures + 1)); }
expect "^helm release distrain installed in distrain-quickstart; operator pod distrain-operator-[a-z0-9]+-[a-z0-9]+ leads" \
  "the chart installed and its operator pod leading"
expect "^onedevice +OneDevice +Succeeded +1 " "the job's kubectl get dtj row in Succeeded"
expect "training complete: steps 1500 .*eval_accuracy 0\.[0-9]+" "the chief's final accuracy line"
expect "^--- onedevice: Succeeded$" "the final verdict"
if [ $failures != 0 ]; then
  echo "--- quickstart --kube output"
  cat "$out"
fi
echo "quickstart --kube: $failures failure(s) in $((SECONDS - start)) s"
[ $failures = 0 ]
