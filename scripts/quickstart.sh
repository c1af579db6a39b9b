#!/usr/bin/env bash
# The README's first command: installs what is missing, builds, and runs the
# default example job locally: examples/multi-worker-mirrored.yaml, a chief
# and three workers training in sync over the TCP ring, as processes.
#   scripts/quickstart.sh [job.yaml]
#
# With --kube, the whole user path on this machine instead: brings up a
# single-node Kubernetes cluster (scripts/node.sh up: the control plane plus a
# kubelet, containerd, CNI and CoreDNS; reused when running; needs root),
# applies the CRDs, builds the worker and operator images with buildah and
# imports them into the node's containerd (tagged with the chart's appVersion,
# so the chart's defaults name them), installs the Helm chart charts/distrain
# (release "distrain" in namespace distrain-quickstart; the operator then runs
# as the chart's pod, in-cluster, under the chart's ServiceAccount and RBAC),
# then `kubectl apply`s the job, follows it to Succeeded or Failed and prints
# the result and the chief's last log lines. At exit the chart is uninstalled;
# the node keeps running (scripts/node.sh down stops it and undoes its changes
# to this machine).
#   scripts/quickstart.sh --kube [--no-build] [job.yaml]
# --no-build skips setup and build (distrain already built in
# ${DISTRAIN_BUILD_DIR:-build}); the e2e test e2e.quickstart_kube uses it.
set -euo pipefail
cd "$(dirname "$0")/.."
kube=0 build=1
while [ $# -gt 0 ]; do
  case "$1" in
    --kube) kube=1 ;;
    --no-build) build=0 ;;
    *) break ;;
  esac
  shift
done
if [ $build = 1 ]; then
  scripts/setup.sh --no-peers
  scripts/build.sh
  if [ $kube = 1 ]; then
    scripts/control-plane.sh build
    scripts/node.sh build
  fi
fi
BUILD="$(cd "${DISTRAIN_BUILD_DIR:-build}" && pwd)"
# Locally the distributed example (four processes, a few seconds); on the
# node the one-pod example, which a 2-core node runs beside its control plane.
if [ $kube = 0 ]; then
  JOB_FILE="${1:-examples/multi-worker-mirrored.yaml}"
else
  JOB_FILE="${1:-examples/onedevice.yaml}"
fi
if [ $kube = 0 ]; then
  exec "$BUILD/cli/distrain" run "$JOB_FILE"
fi

[ "$(id -u)" = 0 ] || { echo "quickstart --kube: the node (scripts/node.sh) needs root (namespaces, mounts, cgroups, iptables); run with sudo" >&2; exit 1; }
ROOT="$PWD"
scripts/node.sh status >/dev/null 2>&1 || scripts/node.sh up >/dev/null
export KUBECONFIG
KUBECONFIG="$(scripts/control-plane.sh kubeconfig)"
KUBECTL="$(scripts/control-plane.sh bindir)/kubectl"
HELM="$(scripts/control-plane.sh helmbin)"
"$KUBECTL" apply --server-side --force-conflicts -f crds/ >/dev/null
# Right after the apply the CRD may have no status.conditions yet, and kubectl
# wait then fails at once instead of waiting: retry, then report.
for _ in $(seq 1 30); do
  "$KUBECTL" wait --for=condition=Established --timeout=60s crd/distributedtrainingjobs.distrain.io \
    >/dev/null 2>&1 && break
  sleep 1
done
"$KUBECTL" wait --for=condition=Established --timeout=60s crd/distributedtrainingjobs.distrain.io >/dev/null

# The images carry the chart's appVersion, the tag its defaults name.
E2E_TAG="$(awk '$1 == "appVersion:" { gsub(/"/, "", $2); print $2 }' charts/distrain/Chart.yaml)"
# shellcheck source=tests/e2e/e2e_lib.sh
. tests/e2e/e2e_lib.sh
NS=distrain-quickstart
REL=distrain
JOB="$(awk '/^metadata:/ { m = 1; next } m && /^  name:/ { print $2; exit }' "$JOB_FILE")"
cleanup() {
  "$KUBECTL" -n "$NS" delete dtj "$JOB" --ignore-not-found --wait=false >/dev/null 2>&1 || true
  "$HELM" uninstall "$REL" -n "$NS" --wait >/dev/null 2>&1 || true
}
trap cleanup EXIT
"$KUBECTL" create namespace "$NS" --dry-run=client -o yaml | "$KUBECTL" apply -f - >/dev/null
"$KUBECTL" -n "$NS" delete dtj "$JOB" --ignore-not-found --wait=true >/dev/null
"$HELM" uninstall "$REL" -n "$NS" --wait >/dev/null 2>&1 || true  # what an interrupted run left
echo "building the images and importing them into the node (tag $E2E_TAG)"
e2e_load_images 2>&1 | sed 's/^/  /'
[ "${PIPESTATUS[0]}" = 0 ] || { echo "quickstart --kube: scripts/node.sh load-images failed" >&2; exit 1; }
# The operator as a user installs it: the chart's Deployment, watching this
# namespace only.
helm_log="$(mktemp /tmp/distrain-quickstart-helm.XXXXXX)"
e2e_helm_install "$REL" "$NS" >"$helm_log" 2>&1 ||
  { cat "$helm_log" >&2; echo "quickstart --kube: helm install failed" >&2; exit 1; }
rm -f "$helm_log"
leader="$(e2e_wait_leader "$REL-operator" "$NS" 60)" ||
  { echo "quickstart --kube: no operator pod took the lease within 60 s:" >&2; "$KUBECTL" -n "$NS" get pods -o wide >&2; exit 1; }
echo "helm release $REL installed in $NS; operator pod $leader leads"
echo "applying $JOB_FILE to namespace $NS"
"$KUBECTL" -n "$NS" apply -f "$JOB_FILE"

# Follow: print the job's row whenever it changes, until Succeeded or Failed,
# or until the deadline (a job that never starts must not hang the command).
last="" state=""
deadline=$((SECONDS + ${DISTRAIN_QUICKSTART_TIMEOUT:-600}))
while :; do
  if [ $SECONDS -ge $deadline ]; then
    echo "quickstart --kube: $JOB neither Succeeded nor Failed within ${DISTRAIN_QUICKSTART_TIMEOUT:-600} s" \
      "(DISTRAIN_QUICKSTART_TIMEOUT); its events and the operator's last log lines:" >&2
    "$KUBECTL" -n "$NS" describe dtj "$JOB" 2>&1 | tail -15 >&2 || true
    "$KUBECTL" -n "$NS" logs "$leader" --tail=10 2>&1 >&2 || true
    exit 1
  fi
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
echo "(the node keeps running: kubectl --kubeconfig $KUBECONFIG ...; scripts/node.sh down stops it)" >&2
[ "$state" = Succeeded ]
