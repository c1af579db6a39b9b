#!/usr/bin/env bash
# The README's first command: installs what is missing, builds, and runs the
# default example job locally (OneDevice on a synthetic dataset).
#   scripts/quickstart.sh [job.yaml]
#
# With --kube, the whole user path on this machine instead: starts the
# developer control plane (scripts/control-plane.sh up; reused when running),
# applies the CRDs, starts the test node agent (tests/e2e/node_agent.cc: runs
# pods as local processes; needs root for /etc/hosts) and the operator (a local
# process with the admin kubeconfig), then `kubectl apply`s the job, follows it
# to Succeeded or Failed and prints the result and the chief's last log lines.
# The agent and operator stop at exit; the control plane keeps running
# (scripts/control-plane.sh down stops it).
#   scripts/quickstart.sh --kube [job.yaml]
set -euo pipefail
cd "$(dirname "$0")/.."
kube=0
if [ "${1:-}" = --kube ]; then
  kube=1
  shift
fi
scripts/setup.sh --no-peers
scripts/build.sh
BUILD="$(cd "${DISTRAIN_BUILD_DIR:-build}" && pwd)"
JOB_FILE="${1:-examples/onedevice.yaml}"
if [ $kube = 0 ]; then
  exec "$BUILD/cli/distrain" run "$JOB_FILE"
fi

[ "$(id -u)" = 0 ] || { echo "quickstart --kube: the test node agent needs root (it manages /etc/hosts); run with sudo" >&2; exit 1; }
ROOT="$PWD"
scripts/control-plane.sh status >/dev/null 2>&1 || scripts/control-plane.sh up >/dev/null
export KUBECONFIG
KUBECONFIG="$(scripts/control-plane.sh kubeconfig)"
KUBECTL="$(scripts/control-plane.sh bindir)/kubectl"
"$KUBECTL" apply --server-side --force-conflicts -f crds/ >/dev/null
"$KUBECTL" wait --for=condition=Established --timeout=60s crd/distributedtrainingjobs.distrain.io >/dev/null

# shellcheck source=tests/e2e/e2e_lib.sh
. tests/e2e/e2e_lib.sh
STATE=/tmp/distrain-quickstart
NS=distrain-quickstart
JOB="$(awk '/^metadata:/ { m = 1; next } m && /^  name:/ { print $2; exit }' "$JOB_FILE")"
cleanup() {
  "$KUBECTL" -n "$NS" delete dtj "$JOB" --ignore-not-found --wait=false >/dev/null 2>&1 || true
  e2e_stop
}
trap cleanup EXIT
"$KUBECTL" create namespace "$NS" --dry-run=client -o yaml | "$KUBECTL" apply -f - >/dev/null
"$KUBECTL" -n "$NS" delete dtj "$JOB" --ignore-not-found --wait=true >/dev/null
rm -rf "$STATE"
e2e_start_node "$STATE" "$NS"
e2e_start_operator "$STATE/operator.log" "$NS"
echo "node agent and operator running (logs in $STATE); applying $JOB_FILE to namespace $NS"
"$KUBECTL" -n "$NS" apply -f "$JOB_FILE"

# Follow: print the job's row whenever it changes, until Succeeded or Failed.
last="" state=""
while :; do
  row="$("$KUBECTL" -n "$NS" get dtj "$JOB" --no-headers 2>/dev/null || true)"
  [ "$row" != "$last" ] && [ -n "$row" ] && echo "$row" && last="$row"
  state="$("$KUBECTL" -n "$NS" get dtj "$JOB" \
    -o jsonpath='{range .status.conditions[?(@.status=="True")]}{.type} {end}' 2>/dev/null || true)"
  case " $state " in *" Succeeded "*) state=Succeeded; break ;; *" Failed "*) state=Failed; break ;; esac
  sleep 1
done
echo
"$KUBECTL" -n "$NS" get dtj "$JOB"
chief="$JOB-chief-0"
"$KUBECTL" -n "$NS" get pod "$chief" >/dev/null 2>&1 || chief="$JOB-worker-0"
echo "--- kubectl logs $chief --tail=3"
"$KUBECTL" -n "$NS" logs "$chief" --tail=3 || true
echo "--- $JOB: $state"
[ "$state" = Succeeded ]
