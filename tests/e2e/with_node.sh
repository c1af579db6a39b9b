#!/usr/bin/env bash
# Runs a command against the real node (scripts/node.sh): reuses the running
# node, or brings one up (with its control plane) and takes down at exit what it
# started. Then as tests/kube/with_control_plane.sh: CRDs applied, KUBECONFIG,
# DISTRAIN_KUBE_BINDIR and DISTRAIN_CONTROL_PLANE exported; DISTRAIN_NODE_SH too.
#   tests/e2e/with_node.sh bash tests/e2e/real_node_test.sh build
# Exits 77 (skipped) without root: the node needs it.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
CP="$ROOT/scripts/control-plane.sh"
export DISTRAIN_NODE_SH="$ROOT/scripts/node.sh"
if [ "$(id -u)" != 0 ]; then
  echo "SKIP: the real node (scripts/node.sh) needs root: namespaces, mounts, cgroups, iptables"
  exit 77
fi
cp_started=0 node_started=0
"$CP" status >/dev/null 2>&1 || cp_started=1
cleanup() {
  if [ "$node_started" = 1 ]; then "$DISTRAIN_NODE_SH" down >/dev/null 2>&1 || echo "[with-node] scripts/node.sh down failed" >&2; fi
  if [ "$cp_started" = 1 ]; then "$CP" down >/dev/null 2>&1; fi
}
trap cleanup EXIT
if ! "$DISTRAIN_NODE_SH" status >/dev/null 2>&1; then
  echo "[with-node] bringing the node up (scripts/node.sh up)" >&2
  node_started=1
  t0=$SECONDS
  "$DISTRAIN_NODE_SH" up >/dev/null || { echo "[with-node] scripts/node.sh up failed (its messages are above)" >&2; exit 1; }
  echo "[with-node] node up in $((SECONDS - t0)) s" >&2
fi
bash "$ROOT/tests/kube/with_control_plane.sh" "$@"
