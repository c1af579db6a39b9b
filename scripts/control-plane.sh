#!/usr/bin/env bash
# The developer cluster: a real Kubernetes control plane on 127.0.0.1 — etcd,
# kube-apiserver, kube-controller-manager (garbage collector, service-account
# tokens) and kubectl — built from the Go modules pinned in
# scripts/control_plane/go.mod and cached under
# ${DISTRAIN_CACHE:-~/.cache/distrain}/kube-<version>/bin. There are no nodes:
# pods stay Pending unless a test drives their phase through the API, or
# scripts/node.sh adds a real one (kubelet, kube-scheduler and kube-proxy are
# built here too, in the same cached step).
#
#   scripts/control-plane.sh build            build the binaries (once per version)
#   scripts/control-plane.sh up               build if needed, start, wait until ready,
#                                             print `export KUBECONFIG=...`
#   scripts/control-plane.sh down             stop what `up` started, delete the state
#   scripts/control-plane.sh status           what runs, where, and whether it is healthy
#   scripts/control-plane.sh kubeconfig       print the admin kubeconfig's path
#   scripts/control-plane.sh bindir           print the directory holding the binaries
#   scripts/control-plane.sh restart [--kill] COMPONENT
#                                             restart etcd | kube-apiserver |
#                                             kube-controller-manager, keeping the data;
#                                             --kill: SIGKILL it first (a crash)
#   scripts/control-plane.sh kubectl ARGS...  run the cached kubectl as cluster admin
#   scripts/control-plane.sh helm ARGS...     run the cached helm as cluster admin
#   scripts/control-plane.sh helmbin          print the helm binary's path
#
# Environment: DISTRAIN_CACHE (binaries and Go caches), DISTRAIN_KUBE_DIR (state:
# certificates, kubeconfigs, etcd data, logs, pid files; default /tmp/distrain-kube),
# DISTRAIN_KUBE_APISERVER_PORT / DISTRAIN_KUBE_ETCD_PORT (default: free ports),
# DISTRAIN_KUBE_APISERVER_ARGS / DISTRAIN_KUBE_CONTROLLER_MANAGER_ARGS (extra flags),
# GO (the go binary; default: go in PATH, else /usr/local/go/bin/go).
set -euo pipefail

# The control plane's version is the cache key; it must match the require in
# scripts/control_plane/go.mod (checked by `build`). etcd is the server module
# that this Kubernetes release itself pins, so the API server gets the etcd it is
# tested with.
K8S_VERSION=v1.36.3
ETCD_VERSION=v3.6.8
# Helm is built from its own module (scripts/helm/go.mod): it pins other client-go versions.
HELM_VERSION=v3.22.0

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MODULE_DIR="$ROOT/scripts/control_plane"
CACHE="${DISTRAIN_CACHE:-$HOME/.cache/distrain}"
BIN="$CACHE/kube-$K8S_VERSION/bin"
HELM_BIN="$CACHE/helm-$HELM_VERSION/bin/helm"
HELM_MODULE_DIR="$ROOT/scripts/helm"
STATE="${DISTRAIN_KUBE_DIR:-/tmp/distrain-kube}"
PKI="$STATE/pki"
COMPONENTS=(etcd kube-apiserver kube-controller-manager)
READY_TIMEOUT_S="${DISTRAIN_KUBE_READY_TIMEOUT:-120}"

log() { printf '[control-plane] %s\n' "$*" >&2; }
die() { printf '[control-plane] error: %s\n' "$*" >&2; exit 1; }

# ---------------------------------------------------------------------------
# build

# shellcheck source=scripts/find_go.sh
. "$ROOT/scripts/find_go.sh"

go_mod_go_version() { awk '$1 == "go" { print $2; exit }' "$MODULE_DIR/go.mod"; }

# Succeeds when version $1 >= version $2 (dotted numbers).
version_at_least() { [ "$(printf '%s\n%s\n' "$2" "$1" | sort -V | head -n1)" = "$2" ]; }

binaries_present() {
  local b
  for b in etcd kube-apiserver kube-controller-manager kubectl kubelet kube-scheduler kube-proxy; do
    [ -x "$BIN/$b" ] || return 1
  done
}

# Helm CLI, cached like the control plane; shares the Go module and build caches.
build_helm() {
  [ -x "$HELM_BIN" ] && { log "Helm $HELM_VERSION: cached in $HELM_BIN"; return 0; }
  local mod_helm go
  mod_helm="$(awk '$1 == "helm.sh/helm/v3" && $2 ~ /^v/ { print $2; exit }' "$HELM_MODULE_DIR/go.mod")"
  [ "$mod_helm" = "$HELM_VERSION" ] || die "scripts/helm/go.mod pins helm $mod_helm but HELM_VERSION in $0 is $HELM_VERSION; make them agree."
  mkdir -p "$CACHE"
  exec 9>"$CACHE/helm-$HELM_VERSION.build.lock"
  flock 9
  if [ ! -x "$HELM_BIN" ]; then
    go="$(find_go "the control plane")"
    export GOMODCACHE="$CACHE/go/mod" GOCACHE="$CACHE/go/build"
    export GOFLAGS="${GOFLAGS:-} -modcacherw" GOTOOLCHAIN=local CGO_ENABLED=0
    local out="$HELM_BIN.partial.$$" start=$SECONDS
    mkdir -p "$(dirname "$HELM_BIN")"
    log "building Helm $HELM_VERSION into $HELM_BIN (a few minutes on a cold cache)"
    (cd "$HELM_MODULE_DIR" && "$go" build -trimpath \
      -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION" \
      -o "$out" helm.sh/helm/v3/cmd/helm) || { rm -f "$out"; die "go build of helm failed (output above)"; }
    mv "$out" "$HELM_BIN"
    log "built helm in $((SECONDS - start)) s"
  fi
  exec 9>&-
}

cmd_build() {
  build_helm
  if binaries_present; then
    log "Kubernetes $K8S_VERSION + etcd $ETCD_VERSION: cached in $BIN"
    return 0
  fi
  local mod_k8s mod_etcd
  mod_k8s="$(awk '$1 == "k8s.io/kubernetes" && $2 ~ /^v/ { print $2; exit }' "$MODULE_DIR/go.mod")"
  mod_etcd="$(awk '$1 == "go.etcd.io/etcd/server/v3" && $2 ~ /^v/ { print $2; exit }' "$MODULE_DIR/go.mod")"
  [ "$mod_k8s" = "$K8S_VERSION" ] || die "scripts/control_plane/go.mod pins k8s.io/kubernetes $mod_k8s but K8S_VERSION in $0 is $K8S_VERSION; make them agree."
  [ "$mod_etcd" = "$ETCD_VERSION" ] || die "scripts/control_plane/go.mod pins etcd server $mod_etcd but ETCD_VERSION in $0 is $ETCD_VERSION; make them agree."

  # One build at a time per version (parallel callers wait, then find it cached).
  mkdir -p "$CACHE"
  exec 8>"$CACHE/kube-$K8S_VERSION.build.lock"
  flock 8
  if binaries_present; then
    log "Kubernetes $K8S_VERSION + etcd $ETCD_VERSION: built meanwhile by another caller, cached in $BIN"
    exec 8>&-
    return 0
  fi

  local go have need
  go="$(find_go "the control plane")"
  have="$("$go" env GOVERSION | sed 's/^go//')"
  need="$(go_mod_go_version)"
  version_at_least "$have" "$need" || die "$go is Go $have; Kubernetes $K8S_VERSION needs Go >= $need. Install a newer Go into /usr/local/go or set GO=/path/to/go."

  # Go's caches live next to the binaries so a rebuild (new version, or a wiped
  # bin dir) downloads and compiles only what changed.
  export GOMODCACHE="$CACHE/go/mod" GOCACHE="$CACHE/go/build"
  export GOFLAGS="${GOFLAGS:-} -modcacherw" GOTOOLCHAIN=local CGO_ENABLED=0
  mkdir -p "$GOMODCACHE" "$GOCACHE" "$(dirname "$BIN")"
  local out="$BIN.partial.$$"
  rm -rf "$out"
  mkdir -p "$out"
  log "building Kubernetes $K8S_VERSION (kube-apiserver, kube-controller-manager, kubectl; kubelet, kube-scheduler, kube-proxy for scripts/node.sh) and etcd $ETCD_VERSION with Go $have into $BIN"
  log "a cold build downloads ~600 MB of modules and compiles for 10-20 minutes on 2 cores; later runs use the cache"
  local start=$SECONDS
  # One invocation for all four programs so the packages they share (apimachinery,
  # client-go, grpc, the etcd client...) compile once. The version variables make
  # `kubectl version` and the API server's /version report the real release.
  local vpkg=k8s.io/component-base/version minor="${K8S_VERSION#v1.}"
  minor="${minor%%.*}"
  (cd "$MODULE_DIR" && "$go" build -trimpath \
    -ldflags "-s -w -X $vpkg.gitVersion=$K8S_VERSION -X $vpkg.gitMajor=1 -X $vpkg.gitMinor=$minor -X $vpkg.gitTreeState=clean" \
    -o "$out/" tool) || { rm -rf "$out"; die "go build failed (output above)"; }
  # The etcd server's main package is go.etcd.io/etcd/server/v3, which go names "server".
  mv "$out/server" "$out/etcd"
  rm -rf "$BIN"
  mv "$out" "$BIN"
  binaries_present || die "build finished but $BIN lacks a binary: $(ls "$BIN")"
  exec 8>&-
  log "built in $((SECONDS - start)) s: $(du -sh "$BIN" | cut -f1) of binaries; cache $(du -sh "$CACHE/go" | cut -f1) of Go modules and build cache"
}

# ---------------------------------------------------------------------------
# certificates and kubeconfigs

# free_ports N: N distinct loopback ports that were free a moment ago (all held
# open together so none repeats).
free_ports() {
  python3 -c 'import socket, sys
socks = [socket.socket() for _ in range(int(sys.argv[1]))]
for s in socks: s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in socks))' "$1"
}

# make_ca NAME COMMON_NAME: a self-signed CA, NAME.key and NAME.crt, valid ten years.
make_ca() {
  openssl genrsa -out "$PKI/$1.key" 2048 2>/dev/null
  openssl req -x509 -new -key "$PKI/$1.key" -subj "/CN=$2" -days 3650 -sha256 \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign,digitalSignature" \
    -out "$PKI/$1.crt" 2>/dev/null
}

# sign_cert CA NAME SUBJECT EXTENSIONS: a 2048-bit RSA key NAME.key and a
# certificate NAME.crt signed by CA.crt, valid for a year.
sign_cert() {
  local ca="$1" name="$2" subject="$3" ext="$4"
  openssl genrsa -out "$PKI/$name.key" 2048 2>/dev/null
  openssl req -new -key "$PKI/$name.key" -subj "$subject" -out "$PKI/$name.csr" 2>/dev/null
  printf '%s\n' "$ext" >"$PKI/$name.ext"
  openssl x509 -req -in "$PKI/$name.csr" -CA "$PKI/$ca.crt" -CAkey "$PKI/$ca.key" \
    -set_serial "0x$(openssl rand -hex 16)" -days 365 -sha256 \
    -extfile "$PKI/$name.ext" -out "$PKI/$name.crt" 2>/dev/null
  rm -f "$PKI/$name.csr" "$PKI/$name.ext"
}

generate_pki() {
  command -v openssl >/dev/null || die "openssl not found; run scripts/setup.sh (Debian package openssl)"
  mkdir -p "$PKI"
  chmod 700 "$PKI"
  make_ca ca distrain-dev-ca
  local leaf="basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment"
  sign_cert ca apiserver "/CN=kube-apiserver" "$leaf
extendedKeyUsage=serverAuth
subjectAltName=IP:127.0.0.1,DNS:localhost,IP:10.96.0.1,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
  sign_cert ca admin "/O=system:masters/CN=distrain-admin" "$leaf
extendedKeyUsage=clientAuth"
  sign_cert ca controller-manager "/CN=system:kube-controller-manager" "$leaf
extendedKeyUsage=clientAuth"
  # The API server's credentials at a kubelet (logs, exec) on scripts/node.sh's node.
  sign_cert ca apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client" "$leaf
extendedKeyUsage=clientAuth"
  # The front-proxy CA authenticates the API server to aggregated API servers and
  # to the controller manager's delegated authentication (which otherwise logs
  # "missing content for CA bundle" every few seconds).
  make_ca front-proxy-ca distrain-front-proxy-ca
  sign_cert front-proxy-ca front-proxy-client "/CN=front-proxy-client" "$leaf
extendedKeyUsage=clientAuth"
  # The service-account key pair: the API server signs and verifies tokens with
  # it, the controller manager signs the legacy token secrets.
  openssl genrsa -out "$PKI/sa.key" 2048 2>/dev/null
  openssl rsa -in "$PKI/sa.key" -pubout -out "$PKI/sa.pub" 2>/dev/null
}

# write_kubeconfig FILE USER CERT_NAME: credentials embedded, like kind and kubeadm write them.
write_kubeconfig() {
  local file="$1" user="$2" cert="$3"
  cat >"$file" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: distrain
  cluster:
    server: https://127.0.0.1:$API_PORT
    certificate-authority-data: $(base64 -w0 "$PKI/ca.crt")
users:
- name: $user
  user:
    client-certificate-data: $(base64 -w0 "$PKI/$cert.crt")
    client-key-data: $(base64 -w0 "$PKI/$cert.key")
contexts:
- name: $user@distrain
  context:
    cluster: distrain
    user: $user
current-context: $user@distrain
EOF
  chmod 600 "$file"
}

# ---------------------------------------------------------------------------
# processes

pid_of() { cat "$STATE/$1.pid" 2>/dev/null || true; }

# A component runs when its pid file names a live process that is still our
# binary (pids are recycled).
running() {
  local pid cmd
  pid="$(pid_of "$1")"
  [ -n "$pid" ] && [ -r "/proc/$pid/cmdline" ] || return 1
  cmd="$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null)"
  [[ "$cmd" == "$BIN/$1 "* ]]
}

# Extra API server flags: DISTRAIN_KUBE_APISERVER_ARGS when set (remembered in
# the state), else those it was last started with, so that a `restart` keeps the
# flags scripts/node.sh starts it with.
apiserver_extra_args() {
  if [ -n "${DISTRAIN_KUBE_APISERVER_ARGS+x}" ]; then
    printf '%s\n' "$DISTRAIN_KUBE_APISERVER_ARGS" | tee "$STATE/kube-apiserver.args"
  else
    cat "$STATE/kube-apiserver.args" 2>/dev/null || true
  fi
}

# (A control plane whose state predates that certificate restarts without it.)
kubelet_client_args() {
  [ -f "$PKI/apiserver-kubelet-client.crt" ] || return 0
  echo --kubelet-client-certificate="$PKI/apiserver-kubelet-client.crt" --kubelet-client-key="$PKI/apiserver-kubelet-client.key"
}

component_args() {
  case "$1" in
    etcd)
      # --unsafe-no-fsync: the state is scratch data under /tmp; without fsync
      # etcd keeps up with hundreds of writes per second on slow disks.
      echo --name=distrain --data-dir="$STATE/etcd" \
        --listen-client-urls="http://127.0.0.1:$ETCD_PORT" --advertise-client-urls="http://127.0.0.1:$ETCD_PORT" \
        --listen-peer-urls="http://127.0.0.1:$ETCD_PEER_PORT" --initial-advertise-peer-urls="http://127.0.0.1:$ETCD_PEER_PORT" \
        --initial-cluster="distrain=http://127.0.0.1:$ETCD_PEER_PORT" \
        --unsafe-no-fsync --log-level=warn
      ;;
    kube-apiserver)
      # --endpoint-reconciler-type=none: Endpoints may not hold a loopback address,
      # so the default reconciler would fail every 10 s publishing 127.0.0.1 for the
      # `kubernetes` Service; nothing here reaches the API server through it.
      echo --bind-address=127.0.0.1 --advertise-address=127.0.0.1 --secure-port="$API_PORT" \
        --etcd-servers="http://127.0.0.1:$ETCD_PORT" \
        --tls-cert-file="$PKI/apiserver.crt" --tls-private-key-file="$PKI/apiserver.key" \
        --client-ca-file="$PKI/ca.crt" \
        --service-account-issuer=https://kubernetes.default.svc.cluster.local \
        --service-account-key-file="$PKI/sa.pub" --service-account-signing-key-file="$PKI/sa.key" \
        --authorization-mode=Node,RBAC --service-cluster-ip-range=10.96.0.0/16 \
        --requestheader-client-ca-file="$PKI/front-proxy-ca.crt" --requestheader-allowed-names=front-proxy-client \
        --requestheader-username-headers=X-Remote-User --requestheader-group-headers=X-Remote-Group \
        --requestheader-extra-headers-prefix=X-Remote-Extra- \
        --proxy-client-cert-file="$PKI/front-proxy-client.crt" --proxy-client-key-file="$PKI/front-proxy-client.key" \
        --allow-privileged=true --profiling=false --endpoint-reconciler-type=none \
        --kubelet-preferred-address-types=InternalIP \
        $(kubelet_client_args) $(apiserver_extra_args)
      ;;
    kube-controller-manager)
      # Controllers that need a cloud provider, node CIDRs or a kubelet only log
      # errors here; the rest (garbage collector, service accounts and their
      # tokens, namespaces, jobs, ...) run.
      echo --kubeconfig="$STATE/controller-manager.kubeconfig" \
        --authentication-kubeconfig="$STATE/controller-manager.kubeconfig" \
        --authorization-kubeconfig="$STATE/controller-manager.kubeconfig" \
        --bind-address=127.0.0.1 --secure-port="$KCM_PORT" \
        --service-account-private-key-file="$PKI/sa.key" --root-ca-file="$PKI/ca.crt" \
        --use-service-account-credentials=true --leader-elect=false \
        --cluster-signing-cert-file="$PKI/ca.crt" --cluster-signing-key-file="$PKI/ca.key" \
        --controllers="$KCM_CONTROLLERS" --profiling=false \
        ${DISTRAIN_KUBE_CONTROLLER_MANAGER_ARGS:-}
      ;;
  esac
}

KCM_CONTROLLERS='*,-cloud-node-lifecycle-controller,-node-route-controller,-service-lb-controller,-node-ipam-controller,-persistentvolume-attach-detach-controller,-persistentvolume-expander-controller,-ttl-controller'

load_ports() {
  [ -f "$STATE/ports" ] || die "no control plane state in $STATE (run: $0 up)"
  # shellcheck disable=SC1091
  . "$STATE/ports"
}

start_component() {
  local c="$1"
  # setsid + closed stdio: the component outlives this script and never holds the
  # caller's pipes (ctest waits for those to close) nor the locks (fds 8, 9).
  # shellcheck disable=SC2046
  setsid "$BIN/$c" $(component_args "$c") </dev/null >>"$STATE/logs/$c.log" 2>&1 8>&- 9>&- &
  echo $! >"$STATE/$c.pid"
}

stop_component() {
  local c="$1" pid i
  running "$c" || { rm -f "$STATE/$c.pid"; return 0; }
  pid="$(pid_of "$c")"
  kill -TERM "$pid" 2>/dev/null || true
  # Wait for the pid itself to go, not only its command line: a process tearing
  # down already shows an empty one but may still hold its port.
  for i in $(seq 1 100); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  if kill -0 "$pid" 2>/dev/null; then
    log "$c (pid $pid) ignored SIGTERM for 10 s; killing it"
    kill -KILL "$pid" 2>/dev/null || true
    for i in $(seq 1 50); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
  fi
  rm -f "$STATE/$c.pid"
}

probe() {
  case "$1" in
    etcd) curl -sf --max-time 2 "http://127.0.0.1:$ETCD_PORT/health" | grep -q '"health":"true"' ;;
    kube-apiserver) [ "$(curl -s --max-time 5 --cacert "$PKI/ca.crt" --cert "$PKI/admin.crt" --key "$PKI/admin.key" \
      "https://127.0.0.1:$API_PORT/readyz")" = ok ] ;;
    kube-controller-manager) [ "$(curl -s --max-time 2 --cacert "$PKI/ca.crt" -k "https://127.0.0.1:$KCM_PORT/healthz")" = ok ] ;;
  esac
}

# wait_ready COMPONENT: until its health endpoint says ok; fails early when the
# process died, and shows its log either way.
wait_ready() {
  local c="$1" deadline=$((SECONDS + READY_TIMEOUT_S))
  until probe "$c"; do
    # kill -0, not `running`: just after the fork the child may not have exec'd
    # the binary yet, and its command line is still this script's.
    if ! kill -0 "$(pid_of "$c")" 2>/dev/null; then
      tail -n 30 "$STATE/logs/$c.log" >&2 || true
      die "$c exited during start-up (log above; full log: $STATE/logs/$c.log)"
    fi
    if [ $SECONDS -ge $deadline ]; then
      tail -n 30 "$STATE/logs/$c.log" >&2 || true
      die "$c not healthy after ${READY_TIMEOUT_S} s (log above; full log: $STATE/logs/$c.log)"
    fi
    sleep 0.3
  done
}

kubectl_admin() { "$BIN/kubectl" --kubeconfig="$STATE/admin.kubeconfig" "$@"; }

all_healthy() {
  local c
  for c in "${COMPONENTS[@]}"; do
    running "$c" && probe "$c" || return 1
  done
}

print_export() { echo "export KUBECONFIG=$STATE/admin.kubeconfig"; }

# Serialises up/down/restart across processes sharing one state dir.
lock_state() {
  mkdir -p "$(dirname "$STATE")"
  exec 9>"$STATE.lock"
  flock -w 300 9 || die "another control-plane.sh holds $STATE.lock"
}

cmd_up() {
  command -v curl >/dev/null || die "curl not found; run scripts/setup.sh"
  command -v python3 >/dev/null || die "python3 not found; run scripts/setup.sh"
  cmd_build
  lock_state
  if [ -f "$STATE/ports" ]; then
    load_ports
    if all_healthy; then
      log "already up and healthy (state in $STATE)"
      print_export
      return 0
    fi
    log "found a partly running control plane in $STATE; stopping it and starting afresh"
    stop_all
  fi
  rm -rf "$STATE"
  mkdir -p "$STATE/logs"
  read -r API_PORT ETCD_PORT ETCD_PEER_PORT KCM_PORT < <(free_ports 4)
  API_PORT="${DISTRAIN_KUBE_APISERVER_PORT:-$API_PORT}"
  ETCD_PORT="${DISTRAIN_KUBE_ETCD_PORT:-$ETCD_PORT}"
  printf 'API_PORT=%s\nETCD_PORT=%s\nETCD_PEER_PORT=%s\nKCM_PORT=%s\n' \
    "$API_PORT" "$ETCD_PORT" "$ETCD_PEER_PORT" "$KCM_PORT" >"$STATE/ports"
  log "generating certificates and kubeconfigs in $STATE"
  generate_pki
  write_kubeconfig "$STATE/admin.kubeconfig" distrain-admin admin
  write_kubeconfig "$STATE/controller-manager.kubeconfig" system:kube-controller-manager controller-manager
  local c start=$SECONDS
  for c in "${COMPONENTS[@]}"; do
    log "starting $c"
    start_component "$c"
    wait_ready "$c"
  done
  # Pods are admitted only once their namespace has a default service account, and
  # that comes from the controller manager: wait for it so callers can create pods.
  local deadline=$((SECONDS + READY_TIMEOUT_S))
  until kubectl_admin get serviceaccount default -n default >/dev/null 2>&1; do
    [ $SECONDS -lt $deadline ] || die "the default service account never appeared; see $STATE/logs/kube-controller-manager.log"
    sleep 0.5
  done
  log "up in $((SECONDS - start)) s: API server https://127.0.0.1:$API_PORT, etcd http://127.0.0.1:$ETCD_PORT, logs in $STATE/logs"
  print_export
}

stop_all() {
  local i
  # Reverse start order: the API server's last writes still reach etcd.
  for ((i = ${#COMPONENTS[@]} - 1; i >= 0; i--)); do
    stop_component "${COMPONENTS[$i]}"
  done
}

cmd_down() {
  lock_state
  if [ ! -d "$STATE" ]; then
    log "nothing to stop ($STATE does not exist)"
    return 0
  fi
  stop_all
  rm -rf "$STATE"
  log "stopped; removed $STATE"
}

cmd_status() {
  if [ ! -f "$STATE/ports" ]; then
    echo "down (no state in $STATE)"
    return 3
  fi
  load_ports
  local c rc=0
  for c in "${COMPONENTS[@]}"; do
    if ! running "$c"; then
      printf '%-24s not running\n' "$c"
      rc=3
    elif probe "$c"; then
      printf '%-24s running (pid %s), healthy\n' "$c" "$(pid_of "$c")"
    else
      printf '%-24s running (pid %s), NOT healthy\n' "$c" "$(pid_of "$c")"
      rc=3
    fi
  done
  echo "API server: https://127.0.0.1:$API_PORT   etcd: http://127.0.0.1:$ETCD_PORT   state: $STATE"
  print_export
  return $rc
}

cmd_restart() {
  local kill=0 c
  if [ "${1:-}" = --kill ]; then
    kill=1
    shift
  fi
  c="${1:-}"
  case "$c" in etcd | kube-apiserver | kube-controller-manager) ;; *) die "usage: restart [--kill] ${COMPONENTS[*]// / | }" ;; esac
  lock_state
  load_ports
  if [ $kill = 1 ] && running "$c"; then
    # A crash, not a shutdown: no graceful close of watches or leases.
    kill -KILL "$(pid_of "$c")"
  fi
  stop_component "$c"
  start_component "$c"
  # The others reconnect on their own; wait until they are healthy again too.
  local other
  for other in "${COMPONENTS[@]}"; do
    if [ "$other" = "$c" ] || running "$other"; then wait_ready "$other"; fi
  done
  log "$c restarted"
}

case "${1:-}" in
  build) cmd_build ;;
  up) cmd_up ;;
  down) cmd_down ;;
  status) cmd_status ;;
  kubeconfig) echo "$STATE/admin.kubeconfig" ;;
  bindir) echo "$BIN" ;;
  restart) shift; cmd_restart "$@" ;;
  kubectl) shift; exec "$BIN/kubectl" --kubeconfig="$STATE/admin.kubeconfig" "$@" ;;
  helm) shift; build_helm; exec "$HELM_BIN" --kubeconfig="$STATE/admin.kubeconfig" "$@" ;;
  helmbin) build_helm >&2; echo "$HELM_BIN" ;;
  -h | --help | help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0" ;;
  *) echo "usage: $0 build|up|down|status|kubeconfig|bindir|helmbin|restart [--kill] COMPONENT|kubectl ARGS...|helm ARGS... (see --help)" >&2; exit 2 ;;
esac
