#!/usr/bin/env bash
# The Prometheus server the e2e tier scrapes the cluster with
# (e2e.prometheus_dashboard), built from its pinned Go module
# (scripts/prometheus/go.mod) and cached by version, like the control plane.
# Debian 12's prometheus package (2.42) cannot be used for this: it is built
# without kubernetes service discovery ("field kubernetes_sd_configs not found
# in type config.ScrapeConfig"), and the test scrapes exactly what the chart's
# scrape configuration discovers through the API server.
#
#   scripts/prometheus.sh build    build prometheus + promtool (or find them cached)
#   scripts/prometheus.sh bindir   print the directory that holds them
#
# Environment: DISTRAIN_CACHE (default ~/.cache/distrain: binaries in
# prometheus-<version>/bin, Go caches in go/, shared with control-plane.sh),
# GO (the go binary; default: PATH, then /usr/local/go/bin/go).
# Built with kubernetes service discovery only (Prometheus' build tags
# remove_all_sd + enable_kubernetes_sd): the cloud providers' SDKs that every
# other discovery pulls in were most of a cold build (14 CPU-minutes on 2
# cores) and are never used here. Cached, it returns at once.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PROMETHEUS_VERSION=v0.315.1  # the Go module's version of Prometheus 3.15.1
CACHE="${DISTRAIN_CACHE:-$HOME/.cache/distrain}"
BUILD_TAGS=remove_all_sd,enable_kubernetes_sd
BIN="$CACHE/prometheus-$PROMETHEUS_VERSION-k8s-sd/bin"
MODULE_DIR="$ROOT/scripts/prometheus"
log() { printf '[prometheus] %s\n' "$*" >&2; }
die() { printf 'prometheus.sh: %s\n' "$*" >&2; exit 1; }

# shellcheck source=scripts/find_go.sh
. "$ROOT/scripts/find_go.sh"

cmd_build() {
  if [ -x "$BIN/prometheus" ] && [ -x "$BIN/promtool" ]; then
    log "Prometheus $PROMETHEUS_VERSION: cached in $BIN"
    return 0
  fi
  local pinned
  pinned="$(awk '$1 == "require" && $2 == "github.com/prometheus/prometheus" { print $3; exit }
                 $1 == "github.com/prometheus/prometheus" && $2 ~ /^v/ { print $2; exit }' "$MODULE_DIR/go.mod")"
  [ "$pinned" = "$PROMETHEUS_VERSION" ] ||
    die "scripts/prometheus/go.mod pins github.com/prometheus/prometheus $pinned but PROMETHEUS_VERSION in $0 is $PROMETHEUS_VERSION; make them agree"
  mkdir -p "$CACHE"
  exec 9>"$CACHE/prometheus-$PROMETHEUS_VERSION.build.lock"
  flock 9
  if [ ! -x "$BIN/prometheus" ] || [ ! -x "$BIN/promtool" ]; then
    local go out="$BIN.partial.$$" start=$SECONDS release
    go="$(find_go "Prometheus")"
    export GOMODCACHE="$CACHE/go/mod" GOCACHE="$CACHE/go/build"
    export GOFLAGS="${GOFLAGS:-} -modcacherw" GOTOOLCHAIN=local CGO_ENABLED=0
    # v0.315.1 -> 3.15.1: what `prometheus --version` and /api/v1/status/buildinfo report.
    release="$(echo "$PROMETHEUS_VERSION" | sed -E 's/^v0\.3([0-9]{2})\.([0-9]+)$/3.\1.\2/; s/^3\.0([0-9])/3.\1/')"
    rm -rf "$out"
    mkdir -p "$out"
    log "building Prometheus $release ($PROMETHEUS_VERSION) into $BIN (several minutes on a cold cache)"
    (cd "$MODULE_DIR" && "$go" build -trimpath -tags "$BUILD_TAGS" \
      -ldflags "-s -w -X github.com/prometheus/common/version.Version=$release -X github.com/prometheus/common/version.Branch=release" \
      -o "$out/" tool) || { rm -rf "$out"; die "go build of prometheus failed (output above)"; }
    rm -rf "$BIN"
    mv "$out" "$BIN"
    log "built in $((SECONDS - start)) s"
  fi
  exec 9>&-
}

case "${1:-}" in
  build) cmd_build ;;
  bindir) echo "$BIN" ;;
  *) sed -n '2,18p' "$0"; exit 2 ;;
esac
