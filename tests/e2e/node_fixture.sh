#!/usr/bin/env bash
# The e2e tier's one real node, shared by every test that needs it (ctest
# fixture e2e_node: tests/e2e/CMakeLists.txt).
#   tests/e2e/node_fixture.sh up BUILD_DIR   the node (scripts/node.sh up) unless one runs,
#                                            then this build's images imported into it
#   tests/e2e/node_fixture.sh down           takes down what `up` started, nothing else
# A node (or control plane) that was already running when `up` ran is someone's
# working cluster: it is reused and left running. Exits 77 (skipped) without root.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
NODE_SH="$ROOT/scripts/node.sh"
CP="$ROOT/scripts/control-plane.sh"
# What `up` started, for `down`; keyed by the node's state directory.
MARK="${DISTRAIN_NODE_DIR:-/tmp/distrain-node}.e2e-fixture"
if [ "$(id -u)" != 0 ]; then
  echo "SKIP: the real node (scripts/node.sh) needs root: namespaces, mounts, cgroups, iptables"
  exit 77
fi
case "${1:-}" in
  up)
    BUILD="${2:?usage: node_fixture.sh up BUILD_DIR}"
    rm -f "$MARK"
    cp_running=0 node_running=0
    "$CP" status >/dev/null 2>&1 && cp_running=1
    "$NODE_SH" status >/dev/null 2>&1 && node_running=1
    t0=$SECONDS
    if [ "$node_running" = 0 ]; then
      "$NODE_SH" up >/dev/null || { echo "FAIL: scripts/node.sh up (its messages are above)"; exit 1; }
      printf 'node=1\ncp=%s\n' "$((1 - cp_running))" >"$MARK"
      echo "node up in $((SECONDS - t0)) s"
    else
      echo "reusing the running node (left running afterwards)"
    fi
    t0=$SECONDS
    "$NODE_SH" load-images --build-dir "$BUILD" --tag e2e ||
      { echo "FAIL: scripts/node.sh load-images --build-dir $BUILD --tag e2e (its messages are above)"; exit 1; }
    echo "images localhost/distrain/{worker,operator}:e2e in the node's containerd ($((SECONDS - t0)) s)"
    ;;
  down)
    [ -f "$MARK" ] || { echo "nothing to take down (the node was running before the tests, or never came up)"; exit 0; }
    # shellcheck disable=SC1090
    . "$MARK"
    rc=0
    if [ "${node:-0}" = 1 ]; then "$NODE_SH" down >/dev/null || { echo "FAIL: scripts/node.sh down"; rc=1; }; fi
    if [ "${cp:-0}" = 1 ]; then "$CP" down >/dev/null || { echo "FAIL: scripts/control-plane.sh down"; rc=1; }; fi
    rm -f "$MARK"
    [ $rc = 0 ] && echo "node taken down"
    exit $rc
    ;;
  *) echo "usage: node_fixture.sh up BUILD_DIR | down" >&2; exit 2 ;;
esac
