#!/usr/bin/env bash
# Runs a command against the developer control plane (scripts/control-plane.sh):
# reuses the running one, or starts one and stops it again at exit. Exports
#   KUBECONFIG               the admin kubeconfig
#   DISTRAIN_KUBE_BINDIR     where kubectl, kube-apiserver, ... live
#   DISTRAIN_CONTROL_PLANE   the control-plane script (tests restart components with it)
# and applies the CRDs from crds/ first, so tests can create jobs at once.
#   tests/kube/with_control_plane.sh build/tests/kube/kube_tests --gtest_filter=...
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
CP="$ROOT/scripts/control-plane.sh"
started=0
if ! "$CP" status >/dev/null 2>&1; then
  echo "[with-control-plane] starting the control plane (scripts/control-plane.sh up)" >&2
  "$CP" up >/dev/null || { echo "[with-control-plane] scripts/control-plane.sh up failed" >&2; exit 1; }
  started=1
fi
cleanup() { [ "$started" = 1 ] && "$CP" down >/dev/null 2>&1; }
trap cleanup EXIT
export KUBECONFIG DISTRAIN_KUBE_BINDIR DISTRAIN_CONTROL_PLANE="$CP"
KUBECONFIG="$("$CP" kubeconfig)"
DISTRAIN_KUBE_BINDIR="$("$CP" bindir)"
"$DISTRAIN_KUBE_BINDIR/kubectl" apply --server-side --force-conflicts -f "$ROOT/crds/" >/dev/null ||
  { echo "[with-control-plane] applying crds/ failed" >&2; exit 1; }
# Right after the apply the CRD may have no status.conditions yet, and kubectl
# wait then fails at once ("accessor error") instead of waiting: retry.
established=0
for _ in $(seq 1 30); do
  if "$DISTRAIN_KUBE_BINDIR/kubectl" wait --for=condition=Established --timeout=60s \
      crd/distributedtrainingjobs.distrain.io >/dev/null 2>&1; then
    established=1
    break
  fi
  sleep 1
done
[ "$established" = 1 ] || { echo "[with-control-plane] the CRD was not Established" >&2; exit 1; }
"$@"
