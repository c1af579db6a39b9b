#!/usr/bin/env bash
# The e2e tier's real node: one single-node Kubernetes cluster per machine,
# layered on scripts/control-plane.sh. Besides the control plane it runs, as
# host processes like the control plane's:
#   containerd + runc    Debian's packages (scripts/setup.sh); pods get their own
#                        namespaces, cgroups (v1, cgroupfs driver, under /distrain-node)
#                        and a sandbox image built here (scripts/node/pause.c)
#   CNI                  Debian's bridge + host-local + portmap plugins: a bridge
#                        distrain0 with the pods' subnet, its gateway address on it so
#                        the host (kubelet probes) reaches pods
#   kubelet              registers the node under its InternalIP, an address on lo
#   kube-scheduler       binds the pods to it
#   kube-proxy           iptables mode: ClusterIP Services (the `kubernetes` Service
#                        in-cluster clients use, the chart's metrics Service)
#   CoreDNS              cluster DNS (Services, headless names, pods) on the node's
#                        address, port 53; built from the Go module pinned in
#                        scripts/node/coredns with no forward plugin: pods never reach
#                        the host's resolver
#   volume provisioner   hostPath PersistentVolumes for claims (scripts/node/provisioner.py)
# Binaries come from the control plane's cached build (kubelet, kube-scheduler,
# kube-proxy are tools of scripts/control_plane/go.mod) and the cache under
# ${DISTRAIN_CACHE:-~/.cache/distrain} (coredns-<version>, images/pause-<hash>.oci.tar).
#
#   scripts/node.sh build                build (or find cached) everything the node runs
#   scripts/node.sh up                   build if needed; start the control plane (or give
#                                        the running one's API server the flags the node
#                                        needs) and the node; wait until it is Ready
#   scripts/node.sh down                 stop it all and undo it: pods and their shims,
#                                        mounts, cgroups, iptables rules, the bridge, the
#                                        lo address, sysctls; the Node object goes too
#   scripts/node.sh status               what runs and whether it is healthy (exit 3: not up)
#   scripts/node.sh load-images [--build-dir DIR] [--tag TAG]
#                                        build the worker and operator images
#                                        (scripts/build-images.sh, as OCI archives under
#                                        the cache) and import them into the node's containerd
#   scripts/node.sh import ARCHIVE...    import OCI/Docker image archives into the node
#   scripts/node.sh ctr ARGS...          the node's containerd client (namespace k8s.io)
#   scripts/node.sh env                  prints the variables tests use (KUBECONFIG, ...)
#
# Needs root (namespaces, mounts, cgroups, iptables). One node per machine: the
# bridge, the lo address, port 53 on it and kube-proxy's iptables rules are
# machine-wide, so `up` refuses while another state directory's node runs.
#
# Environment: DISTRAIN_NODE_DIR (state, default /tmp/distrain-node; under /tmp so
# the hostPath reclaim and overlay snapshots stay on a scratch filesystem),
# DISTRAIN_NODE_IP (default 10.201.0.1), DISTRAIN_NODE_POD_NET (first three octets
# of the pods' /24, default 10.244.0), DISTRAIN_NODE_NAME (default distrain-node),
# plus control-plane.sh's (DISTRAIN_KUBE_DIR, DISTRAIN_CACHE, GO, ...).
#
# Pinned, and what the next upgrade needs. containerd 1.6 (Debian 12) lacks the
# CRI RuntimeConfig call: the v1.36 kubelet logs "CRI implementation should be
# updated to support RuntimeConfig", falls back to cgroupDriver from its config,
# and counts kubelet_cri_losing_support{version="1.37.0"}: 1.37 drops that
# fallback, so moving there needs containerd >= 2.0 (Debian 13's, or a pinned
# static release cached here; its config is `version = 3`, the CRI sections move
# to plugins."io.containerd.cri.v1.runtime" / ."images"). The host is cgroup v1,
# which the kubelet runs on only with failCgroupV1: false and a CgroupV1 warning
# event on the Node; when a release drops it, the node needs a cgroup v2 host.
set -euo pipefail

COREDNS_VERSION=v1.15.0   # must match scripts/node/coredns/go.mod (checked by build)

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CP="$ROOT/scripts/control-plane.sh"
CACHE="${DISTRAIN_CACHE:-$HOME/.cache/distrain}"
NODE="${DISTRAIN_NODE_DIR:-/tmp/distrain-node}"
NODE_IP="${DISTRAIN_NODE_IP:-10.201.0.1}"
POD_NET="${DISTRAIN_NODE_POD_NET:-10.244.0}"
POD_CIDR="$POD_NET.0/24"
POD_GW="$POD_NET.1"
NODE_NAME="${DISTRAIN_NODE_NAME:-distrain-node}"
BRIDGE=distrain0
CGROUP_ROOT=distrain-node
OWNER=/run/distrain-node.owner   # which state directory holds this machine's node
SOCK="$NODE/containerd/containerd.sock"
COREDNS_SRC="$ROOT/scripts/node/coredns"
COREDNS_KEY="$COREDNS_VERSION-$(cat "$COREDNS_SRC/main.go" "$COREDNS_SRC/go.sum" | sha256sum | cut -c1-10)"
COREDNS_BIN="$CACHE/coredns-$COREDNS_KEY/bin/coredns"
PAUSE_KEY="$(sha256sum "$ROOT/scripts/node/pause.c" | cut -c1-10)"
PAUSE_IMAGE="localhost/distrain/pause:$PAUSE_KEY"
PAUSE_TAR="$CACHE/images/pause-$PAUSE_KEY.oci.tar"
# Start order; `down` stops them in reverse.
COMPONENTS=(containerd coredns kube-scheduler kube-proxy kubelet provisioner)
# Sysctls the kubelet and kube-proxy set on the host; `up` records them, `down` restores.
SYSCTLS=(net.ipv4.ip_forward net.bridge.bridge-nf-call-iptables net.ipv4.conf.all.route_localnet
  vm.overcommit_memory vm.panic_on_oom kernel.panic kernel.panic_on_oops
  kernel.keys.root_maxkeys kernel.keys.root_maxbytes)
READY_TIMEOUT_S="${DISTRAIN_NODE_READY_TIMEOUT:-120}"

log() { printf '[node] %s\n' "$*" >&2; }
die() { printf '[node] error: %s\n' "$*" >&2; exit 1; }

# ---------------------------------------------------------------------------
# build

go_env() {
  export GOMODCACHE="$CACHE/go/mod" GOCACHE="$CACHE/go/build"
  export GOFLAGS="${GOFLAGS:-} -modcacherw" GOTOOLCHAIN=local CGO_ENABLED=0
}

build_coredns() {
  [ -x "$COREDNS_BIN" ] && { log "CoreDNS $COREDNS_VERSION: cached in $COREDNS_BIN"; return 0; }
  local mod
  mod="$(awk '$1 == "require" && $2 == "github.com/coredns/coredns" { print $3; exit }' "$COREDNS_SRC/go.mod")"
  [ "$mod" = "$COREDNS_VERSION" ] || die "scripts/node/coredns/go.mod pins CoreDNS '$mod' but COREDNS_VERSION in $0 is $COREDNS_VERSION; make them agree."
  mkdir -p "$CACHE"
  exec 8>"$CACHE/coredns-$COREDNS_KEY.build.lock"
  flock 8
  if [ ! -x "$COREDNS_BIN" ]; then
    local go out start=$SECONDS
    go="${GO:-$(command -v go || echo /usr/local/go/bin/go)}"
    [ -x "$go" ] || die "Go is needed to build CoreDNS (see scripts/control-plane.sh build)"
    go_env
    mkdir -p "$(dirname "$COREDNS_BIN")"
    out="$COREDNS_BIN.partial.$$"
    log "building CoreDNS $COREDNS_VERSION into $COREDNS_BIN (a few minutes on a cold cache)"
    (cd "$COREDNS_SRC" && "$go" build -trimpath -ldflags "-s -w" -o "$out" .) ||
      { rm -f "$out"; die "go build of CoreDNS failed (output above)"; }
    mv "$out" "$COREDNS_BIN"
    log "built CoreDNS in $((SECONDS - start)) s"
  fi
  exec 8>&-
}

# The sandbox image: scripts/node/pause.c, static, alone in an image, kept as an
# OCI archive keyed by the source's hash.
build_pause() {
  [ -f "$PAUSE_TAR" ] && { log "pause image: cached in $PAUSE_TAR"; return 0; }
  command -v buildah >/dev/null || die "buildah is missing; run scripts/setup.sh"
  command -v cc >/dev/null || die "a C compiler is missing; run scripts/setup.sh"
  local work storage ctr
  work="$(mktemp -d)"
  cc -static -Os -o "$work/pause" "$ROOT/scripts/node/pause.c" || { rm -rf "$work"; die "compiling scripts/node/pause.c failed"; }
  strip "$work/pause" 2>/dev/null || true
  # The same buildah store as scripts/build-images.sh (overlay where it mounts, else vfs).
  read -r -a storage < <("$ROOT/scripts/build-images.sh" --print-storage)
  ctr="$(buildah "${storage[@]}" from --pull=never scratch)"
  buildah "${storage[@]}" copy "$ctr" "$work/pause" /pause >/dev/null
  buildah "${storage[@]}" config --entrypoint '["/pause"]' --user 65535:65535 \
    --label io.distrain.source=scripts/node/pause.c "$ctr"
  buildah "${storage[@]}" commit --quiet --rm "$ctr" "$PAUSE_IMAGE" >/dev/null
  mkdir -p "$(dirname "$PAUSE_TAR")"
  buildah "${storage[@]}" push --quiet "$PAUSE_IMAGE" "oci-archive:$PAUSE_TAR.tmp:$PAUSE_IMAGE" >/dev/null
  mv "$PAUSE_TAR.tmp" "$PAUSE_TAR"
  rm -rf "$work"
  log "pause image: built $PAUSE_IMAGE, cached in $PAUSE_TAR"
}

cmd_build() {
  "$CP" build
  build_coredns
  if [ "$(id -u)" = 0 ]; then
    build_pause
  else
    log "pause image: skipped (buildah's store needs root; so does the node)"
  fi
}

# ---------------------------------------------------------------------------
# helpers

BIN=""
load_cp() {
  BIN="$("$CP" bindir)"
  KUBECONFIG_ADMIN="$("$CP" kubeconfig)"
  CP_STATE="$(dirname "$KUBECONFIG_ADMIN")"
  PKI="$CP_STATE/pki"
}

kubectl_admin() { "$BIN/kubectl" --kubeconfig="$KUBECONFIG_ADMIN" "$@"; }
ctr_node() { ctr --address "$SOCK" --namespace k8s.io "$@"; }

free_ports() {
  python3 -c 'import socket, sys
socks = [socket.socket() for _ in range(int(sys.argv[1]))]
for s in socks: s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in socks))' "$1"
}

# sign NAME SUBJECT EXT: NAME.key/NAME.crt under $NODE/pki, signed by the control plane's CA.
sign() {
  local name="$1" subject="$2" ext="$3" d="$NODE/pki"
  openssl genrsa -out "$d/$name.key" 2048 2>/dev/null
  openssl req -new -key "$d/$name.key" -subj "$subject" -out "$d/$name.csr" 2>/dev/null
  printf 'basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n%s\n' "$ext" >"$d/$name.ext"
  openssl x509 -req -in "$d/$name.csr" -CA "$PKI/ca.crt" -CAkey "$PKI/ca.key" \
    -set_serial "0x$(openssl rand -hex 16)" -days 365 -sha256 -extfile "$d/$name.ext" -out "$d/$name.crt" 2>/dev/null
  rm -f "$d/$name.csr" "$d/$name.ext"
}

kubeconfig() {  # FILE CERT_NAME
  cat >"$1" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: distrain
  cluster:
    server: https://127.0.0.1:$API_PORT
    certificate-authority: $PKI/ca.crt
users:
- name: $2
  user:
    client-certificate: $NODE/pki/$2.crt
    client-key: $NODE/pki/$2.key
contexts:
- name: distrain
  context: {cluster: distrain, user: $2}
current-context: distrain
EOF
  chmod 600 "$1"
}

pid_of() { cat "$NODE/$1.pid" 2>/dev/null || true; }
running() {
  local pid
  pid="$(pid_of "$1")"
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || return 1
  # Its arguments (the program may be a wrapper's: pyenv's python3 shim execs another).
  [[ "$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null)" == *" $(cat "$NODE/$1.cmd" 2>/dev/null)" ]]
}

start() {  # NAME ARGV...
  local name="$1"
  shift
  # setsid + closed stdio: outlives this script, never holds the caller's pipes or locks.
  setsid "$@" </dev/null >>"$NODE/logs/$name.log" 2>&1 8>&- 9>&- &
  echo $! >"$NODE/$name.pid"
  shift
  printf '%s ' "$@" >"$NODE/$name.cmd"
}

stop() {  # NAME
  local pid i
  pid="$(pid_of "$1")"
  if [ -n "$pid" ] && running "$1"; then
    kill -TERM "$pid" 2>/dev/null || true
    for i in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
  fi
  rm -f "$NODE/$1.pid"
}

probe() {
  case "$1" in
    containerd) ctr --address "$SOCK" version >/dev/null 2>&1 ;;
    coredns) [ "$(curl -s --max-time 2 "http://127.0.0.1:$DNS_READY_PORT/ready")" = OK ] ;;
    kube-scheduler) [ "$(curl -sk --max-time 2 "https://127.0.0.1:$SCHED_PORT/healthz")" = ok ] ;;
    kube-proxy) curl -sf --max-time 2 "http://127.0.0.1:$PROXY_HEALTH_PORT/healthz" >/dev/null ;;
    kubelet) [ "$(curl -s --max-time 2 "http://127.0.0.1:$KUBELET_HEALTH_PORT/healthz")" = ok ] ;;
    provisioner) running provisioner ;;
  esac
}

wait_ready() {
  local c="$1" deadline=$((SECONDS + READY_TIMEOUT_S))
  until probe "$c"; do
    if ! kill -0 "$(pid_of "$c")" 2>/dev/null; then
      tail -n 30 "$NODE/logs/$c.log" >&2 || true
      die "$c exited during start-up (log above; full log: $NODE/logs/$c.log)"
    fi
    [ $SECONDS -lt $deadline ] || { tail -n 30 "$NODE/logs/$c.log" >&2; die "$c not healthy after ${READY_TIMEOUT_S} s (log: $NODE/logs/$c.log)"; }
    sleep 0.3
  done
}

# ---------------------------------------------------------------------------
# configuration files

write_configs() {
  mkdir -p "$NODE/cni/net.d" "$NODE/cni/ipam" "$NODE/containerd" "$NODE/kubelet" "$NODE/pod-logs" \
    "$NODE/kubelet-plugins" "$NODE/volumes" "$NODE/logs"
  local snapshotter=overlayfs
  # Overlay where the kernel mounts it on this filesystem (not on overlay or vfs-only sandboxes).
  local t="$NODE/containerd/overlay-probe"
  mkdir -p "$t/l" "$t/u" "$t/w" "$t/m"
  if mount -t overlay overlay -o "lowerdir=$t/l,upperdir=$t/u,workdir=$t/w" "$t/m" 2>/dev/null; then
    umount "$t/m"
  else
    snapshotter=native
    log "overlay does not mount under $NODE; containerd uses the native snapshotter (slower)"
  fi
  rm -rf "$t"
  cat >"$NODE/containerd/config.toml" <<EOF
# containerd 1.6 (Debian 12). restrict_oom_score_adj: the machine may lack
# CAP_SYS_RESOURCE, and runc cannot then lower a container's oom_score_adj.
version = 2
root = "$NODE/containerd/root"
state = "$NODE/containerd/state"
plugin_dir = ""
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]
[grpc]
  address = "$SOCK"
[ttrpc]
  address = "$SOCK.ttrpc"
[debug]
  level = "warn"
[plugins."io.containerd.internal.v1.opt"]
  path = "$NODE/containerd/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE_IMAGE"
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  disable_apparmor = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "$snapshotter"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$NODE/cni/net.d"
    max_conf_num = 1
EOF
  cat >"$NODE/cni/net.d/10-distrain.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "distrain",
  "plugins": [
    {"type": "bridge", "bridge": "$BRIDGE", "isGateway": true, "ipMasq": false, "hairpinMode": true,
     "ipam": {"type": "host-local", "dataDir": "$NODE/cni/ipam",
              "ranges": [[{"subnet": "$POD_CIDR", "gateway": "$POD_GW"}]], "routes": [{"dst": "0.0.0.0/0"}]}},
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
EOF
  # resolvConf "": pods never inherit the host's resolver; ClusterFirst pods get
  # CoreDNS on the node's address. Image GC off: the images were imported, not pulled.
  cat >"$NODE/kubelet/config.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $NODE_IP
port: $KUBELET_PORT
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: $KUBELET_HEALTH_PORT
tlsCertFile: $NODE/pki/kubelet-serving.crt
tlsPrivateKeyFile: $NODE/pki/kubelet-serving.key
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $PKI/ca.crt}
authorization: {mode: Webhook}
containerRuntimeEndpoint: unix://$SOCK
cgroupDriver: cgroupfs
cgroupRoot: /$CGROUP_ROOT
failCgroupV1: false
failSwapOn: false
clusterDNS: [$NODE_IP]
clusterDomain: cluster.local
resolvConf: ""
podLogsDir: $NODE/pod-logs
volumePluginDir: $NODE/kubelet-plugins
enableControllerAttachDetach: false
serializeImagePulls: false
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: 50Mi, nodefs.available: 1%, nodefs.inodesFree: 1%, imagefs.available: 1%}
evictionPressureTransitionPeriod: 10s
maxPods: 110
EOF
  cat >"$NODE/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: $NODE/kube-proxy.kubeconfig}
mode: iptables
hostnameOverride: $NODE_NAME
healthzBindAddress: 127.0.0.1:$PROXY_HEALTH_PORT
metricsBindAddress: 127.0.0.1:$PROXY_METRICS_PORT
clusterCIDR: $POD_CIDR
detectLocalMode: ClusterCIDR
nodePortAddresses: ["$NODE_IP/32"]
iptables: {localhostNodePorts: false}
conntrack: {maxPerCore: 0, min: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}
EOF
  cat >"$NODE/Corefile" <<EOF
.:53 {
    bind $NODE_IP
    errors
    ready 127.0.0.1:$DNS_READY_PORT
    health 127.0.0.1:$DNS_HEALTH_PORT
    kubernetes cluster.local in-addr.arpa ip6.arpa {
        kubeconfig $NODE/coredns.kubeconfig distrain
        pods insecure
        ttl 5
    }
    cache 5
}
EOF
}

# What CoreDNS reads (its upstream ClusterRole).
COREDNS_RBAC='apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: "distrain:coredns"}
rules:
- apiGroups: [""]
  resources: [endpoints, services, pods, namespaces]
  verbs: [list, watch]
- apiGroups: [discovery.k8s.io]
  resources: [endpointslices]
  verbs: [list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: "distrain:coredns"}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "distrain:coredns"}
subjects:
- {apiGroup: rbac.authorization.k8s.io, kind: User, name: "distrain:coredns"}'

# ---------------------------------------------------------------------------
# host setup and teardown

cgroup_dirs() {  # the node's directory in every v1 hierarchy (or in the v2 one)
  local d
  if [ -e /sys/fs/cgroup/cgroup.controllers ]; then
    echo "/sys/fs/cgroup/$CGROUP_ROOT"
    return 0
  fi
  # v1 hierarchies have tasks; a hybrid host's cgroup2 one (unified/, where runc
  # makes the containers' cgroups too) has only cgroup.procs.
  for d in /sys/fs/cgroup/*/; do
    [ -e "$d/tasks" ] || [ -e "$d/cgroup.procs" ] && echo "${d%/}/$CGROUP_ROOT"
  done
  return 0
}

host_up() {
  local s d
  # Host directories the kubelet makes whatever its root directory; `down` removes
  # those that were not there before.
  : >"$NODE/created"
  for d in /var/log/containers /var/lib/kubelet; do [ -e "$d" ] || echo "$d" >>"$NODE/created"; done
  : >"$NODE/sysctls"
  for s in "${SYSCTLS[@]}"; do
    [ -e "/proc/sys/${s//.//}" ] && echo "$s=$(sysctl -n "$s")" >>"$NODE/sysctls"
  done
  sysctl -qw net.ipv4.ip_forward=1 net.bridge.bridge-nf-call-iptables=1
  ip addr add "$NODE_IP/32" dev lo 2>/dev/null || ip -o addr show dev lo | grep " $NODE_IP/32 " >/dev/null ||
    die "cannot add $NODE_IP to lo"
  if ! ip link show "$BRIDGE" >/dev/null 2>&1; then
    ip link add "$BRIDGE" type bridge || die "cannot create the bridge $BRIDGE"
  fi
  ip addr replace "$POD_GW/24" dev "$BRIDGE"
  ip link set "$BRIDGE" up
  local d
  for d in $(cgroup_dirs); do
    mkdir -p "$d"
    # A new cpuset cgroup starts empty; give it its parent's CPUs and memory nodes.
    if [ -e "$d/cpuset.cpus" ] && [ -z "$(cat "$d/cpuset.cpus")" ]; then
      cat "$(dirname "$d")/cpuset.cpus" >"$d/cpuset.cpus"
      cat "$(dirname "$d")/cpuset.mems" >"$d/cpuset.mems"
    fi
  done
}

# Kills every process left in the node's cgroups (containers, exec'd shells).
kill_cgroup_procs() {
  local d f pids i
  for i in 1 2 3; do
    pids="$(for d in $(cgroup_dirs); do
      [ ! -d "$d" ] || find "$d" -name cgroup.procs -exec cat {} + 2>/dev/null || true
    done | sort -u)"
    [ -n "$pids" ] || return 0
    # shellcheck disable=SC2086
    kill -KILL $pids 2>/dev/null || true
    sleep 0.5
  done
}

# Every KUBE-* chain (the kubelet's KUBE-FIREWALL and canaries, whatever
# kube-proxy --cleanup left) and the jumps to them, in both families: one node
# per machine, so they are all this node's.
iptables_cleanup() {
  local cmd table chain rule rules chains
  for cmd in iptables ip6tables; do
    command -v "$cmd-save" >/dev/null || continue
    for table in filter nat mangle; do
      rules="$("$cmd-save" -t "$table" 2>/dev/null || true)"
      chains="$(sed -n 's/^:\(KUBE-[^ ]*\) .*/\1/p' <<<"$rules")"
      [ -n "$chains" ] || continue
      while read -r rule; do
        # shellcheck disable=SC2086
        [ -z "$rule" ] || "$cmd" -t "$table" -D ${rule#-A } 2>/dev/null || true
      done < <(grep -E '^-A [A-Z]+ .*-j KUBE-' <<<"$rules" | grep -Ev '^-A KUBE-' || true)
      for chain in $chains; do "$cmd" -t "$table" -F "$chain" 2>/dev/null || true; done
      for chain in $chains; do "$cmd" -t "$table" -X "$chain" 2>/dev/null || true; done
    done
  done
}

host_down() {
  local d m s
  iptables_cleanup
  # Mounts under the state directory (pod volumes, rootfs, sandbox netns and shm), deepest first.
  for m in $(awk -v n="$NODE/" 'index($2, n) == 1 { print $2 }' /proc/mounts | sort -r); do
    umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true
  done
  for d in $(cgroup_dirs); do
    [ -d "$d" ] && find "$d" -depth -type d -exec rmdir {} + 2>/dev/null || true
  done
  ip link del "$BRIDGE" 2>/dev/null || true
  ip addr del "$NODE_IP/32" dev lo 2>/dev/null || true
  if [ -f "$NODE/sysctls" ]; then
    while IFS= read -r s; do sysctl -qw "$s" 2>/dev/null || true; done <"$NODE/sysctls"
  fi
  # The kubelet links each container's log from /var/log/containers, and keeps
  # its device-plugin socket in /var/lib/kubelet whatever its root directory.
  find /var/log/containers -maxdepth 1 -type l -lname "$NODE/*" -delete 2>/dev/null || true
  rm -f /var/lib/kubelet/device-plugins/kubelet.sock
  if [ -f "$NODE/created" ]; then
    while IFS= read -r d; do rmdir "$d/device-plugins" "$d" 2>/dev/null || true; done <"$NODE/created"
  fi
}

# ---------------------------------------------------------------------------
# commands

preflight() {
  [ "$(id -u)" = 0 ] || die "needs root (namespaces, mounts, cgroups, iptables)"
  local c
  for c in containerd containerd-shim-runc-v2 runc ctr ip iptables iptables-restore conntrack sysctl curl openssl python3; do
    command -v "$c" >/dev/null || die "$c is missing; run scripts/setup.sh (Debian packages containerd runc iptables conntrack iproute2)"
  done
  for c in bridge host-local portmap; do
    [ -x "/usr/lib/cni/$c" ] || die "/usr/lib/cni/$c is missing; run scripts/setup.sh (Debian package containernetworking-plugins)"
  done
}

# One node per machine: refuses (before anything starts) while another state
# directory's node holds the machine.
check_machine() {
  local other
  other="$(cat "$OWNER" 2>/dev/null || true)"
  if [ -n "$other" ] && [ "$other" != "$NODE" ] && [ -d "$other" ]; then
    die "this machine's node belongs to $other (DISTRAIN_NODE_DIR=$other $0 down first; one node per machine)"
  fi
  if [ -z "$other" ] && ip link show "$BRIDGE" >/dev/null 2>&1; then
    die "the bridge $BRIDGE exists but no node owns it ($OWNER); another tool's? remove it (ip link del $BRIDGE) and retry"
  fi
}

claim_machine() {
  check_machine
  echo "$NODE" >"$OWNER"
}

# up and down, one at a time on the machine.
lock_node() {
  exec 9>/run/distrain-node.lock
  flock -w 300 9 || die "another scripts/node.sh up/down holds /run/distrain-node.lock"
}

load_ports() {
  [ -f "$NODE/ports" ] || return 1
  # shellcheck disable=SC1091
  . "$NODE/ports"
}

all_healthy() {
  local c
  for c in "${COMPONENTS[@]}"; do running "$c" && probe "$c" || return 1; done
}

# The API server flags a node needs: reachable from pods (the `kubernetes`
# Service's endpoint is the node's address, kube-proxy routes 10.96.0.1 there).
# Anonymous requests still get only /healthz, /readyz, /version.
NODE_APISERVER_ARGS="--bind-address=0.0.0.0 --advertise-address=$NODE_IP --endpoint-reconciler-type=lease"

control_plane_up() {
  if "$CP" status >/dev/null 2>&1; then
    load_cp
    if [ "$(cat "$CP_STATE/kube-apiserver.args" 2>/dev/null)" != "$NODE_APISERVER_ARGS" ]; then
      log "restarting the running API server with the node's flags ($NODE_APISERVER_ARGS)"
      DISTRAIN_KUBE_APISERVER_ARGS="$NODE_APISERVER_ARGS" "$CP" restart kube-apiserver
    fi
  else
    log "starting the control plane (scripts/control-plane.sh up)"
    DISTRAIN_KUBE_APISERVER_ARGS="$NODE_APISERVER_ARGS" "$CP" up >/dev/null
    load_cp
  fi
  # shellcheck disable=SC1091
  . "$CP_STATE/ports"
  [ -f "$PKI/apiserver-kubelet-client.crt" ] ||
    die "the control plane in $CP_STATE predates the API server's kubelet client certificate; restart it (scripts/control-plane.sh down; $0 up)"
}

cmd_up() {
  preflight
  command -v buildah >/dev/null || die "buildah is missing; run scripts/setup.sh"
  cmd_build
  lock_node
  check_machine
  control_plane_up
  # Up means: every process healthy, registered Ready with this control plane, and
  # its credentials from this control plane's CA (a control plane started afresh
  # since has another, and the kubelet's certificate is then worthless).
  if load_ports && all_healthy && cmp -s "$NODE/pki/ca.crt" "$PKI/ca.crt" &&
    [ "$(kubectl_admin get node "$NODE_NAME" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" = True ]; then
    log "already up and healthy (state in $NODE)"
    print_env
    return 0
  fi
  [ -d "$NODE" ] && { log "found a node in $NODE that is partly running or belongs to another control plane; tearing it down first"; teardown; }
  claim_machine
  local start=$SECONDS
  rm -rf --one-file-system "$NODE"
  mkdir -p "$NODE/logs" "$NODE/pki"
  read -r KUBELET_PORT KUBELET_HEALTH_PORT SCHED_PORT PROXY_HEALTH_PORT PROXY_METRICS_PORT DNS_READY_PORT DNS_HEALTH_PORT < <(free_ports 7)
  printf '%s=%s\n' KUBELET_PORT "$KUBELET_PORT" KUBELET_HEALTH_PORT "$KUBELET_HEALTH_PORT" SCHED_PORT "$SCHED_PORT" \
    PROXY_HEALTH_PORT "$PROXY_HEALTH_PORT" PROXY_METRICS_PORT "$PROXY_METRICS_PORT" \
    DNS_READY_PORT "$DNS_READY_PORT" DNS_HEALTH_PORT "$DNS_HEALTH_PORT" >"$NODE/ports"
  # The node's credentials, signed by the control plane's CA.
  cp "$PKI/ca.crt" "$NODE/pki/ca.crt"
  local client="extendedKeyUsage=clientAuth"
  sign kubelet "/O=system:nodes/CN=system:node:$NODE_NAME" "$client"
  sign kubelet-serving "/CN=$NODE_NAME" "extendedKeyUsage=serverAuth
subjectAltName=IP:$NODE_IP,DNS:$NODE_NAME"
  sign kube-scheduler "/CN=system:kube-scheduler" "$client"
  sign kube-proxy "/CN=system:kube-proxy" "$client"
  sign coredns "/CN=distrain:coredns" "$client"
  local c
  for c in kubelet kube-scheduler kube-proxy coredns; do kubeconfig "$NODE/$c.kubeconfig" "$c"; done
  write_configs
  host_up

  log "starting containerd"
  start containerd containerd --config "$NODE/containerd/config.toml"
  wait_ready containerd
  ctr_node images import --all-platforms "$PAUSE_TAR" >/dev/null || die "importing $PAUSE_TAR into containerd failed"
  ctr_node images ls -q | grep -x "$PAUSE_IMAGE" >/dev/null || die "containerd lacks $PAUSE_IMAGE after importing $PAUSE_TAR"

  # (Retried: an API server restarted a moment ago may still be settling.)
  local i out="" applied=0
  for i in $(seq 1 30); do
    out="$(kubectl_admin apply -f - <<<"$COREDNS_RBAC" 2>&1)" && { applied=1; break; }
    sleep 1
  done
  [ "$applied" = 1 ] || die "applying CoreDNS's RBAC failed: $out"
  log "starting CoreDNS on $NODE_IP:53"
  start coredns "$COREDNS_BIN" -conf "$NODE/Corefile"
  log "starting kube-scheduler"
  start kube-scheduler "$BIN/kube-scheduler" --kubeconfig="$NODE/kube-scheduler.kubeconfig" \
    --authentication-kubeconfig="$NODE/kube-scheduler.kubeconfig" --authorization-kubeconfig="$NODE/kube-scheduler.kubeconfig" \
    --bind-address=127.0.0.1 --secure-port="$SCHED_PORT" --leader-elect=false --profiling=false
  log "starting kube-proxy"
  start kube-proxy "$BIN/kube-proxy" --config="$NODE/kube-proxy.yaml"
  log "starting kubelet ($NODE_NAME at $NODE_IP:$KUBELET_PORT)"
  start kubelet "$BIN/kubelet" --config="$NODE/kubelet/config.yaml" --kubeconfig="$NODE/kubelet.kubeconfig" \
    --root-dir="$NODE/kubelet" --cert-dir="$NODE/pki" --hostname-override="$NODE_NAME" --node-ip="$NODE_IP" --v=1
  start provisioner python3 "$ROOT/scripts/node/provisioner.py" "$BIN/kubectl" "$KUBECONFIG_ADMIN" "$NODE_NAME" "$NODE/volumes"
  for c in coredns kube-scheduler kube-proxy kubelet provisioner; do wait_ready "$c"; done
  local deadline=$((SECONDS + READY_TIMEOUT_S))
  until [ "$(kubectl_admin get node "$NODE_NAME" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" = True ]; do
    [ $SECONDS -lt $deadline ] || { tail -n 30 "$NODE/logs/kubelet.log" >&2; die "node $NODE_NAME not Ready after ${READY_TIMEOUT_S} s (log: $NODE/logs/kubelet.log)"; }
    sleep 0.5
  done
  log "up in $((SECONDS - start)) s: node $NODE_NAME Ready at $NODE_IP, pods in $POD_CIDR, DNS $NODE_IP:53, logs in $NODE/logs"
  print_env
}

# Stops every component and undoes the host changes; the state directory goes last.
teardown() {
  local i c pid
  load_ports || true
  for ((i = ${#COMPONENTS[@]} - 1; i >= 0; i--)); do
    c="${COMPONENTS[$i]}"
    [ "$c" = containerd ] && continue
    stop "$c"
  done
  # kube-proxy's rules (every KUBE-* chain it made).
  [ -n "$BIN" ] && [ -x "$BIN/kube-proxy" ] && "$BIN/kube-proxy" --cleanup --v=0 >/dev/null 2>&1 || true
  # Containers: killed in their cgroups; containerd then reaps their shims.
  kill_cgroup_procs
  if running containerd; then
    local task
    for task in $(ctr_node tasks ls -q 2>/dev/null); do
      ctr_node tasks delete -f "$task" >/dev/null 2>&1 || true
    done
    stop containerd
  fi
  # Shims of this containerd that outlived it.
  for pid in $(pgrep -f "containerd-shim-runc-v2 .*-address $SOCK( |\$)" || true); do kill -KILL "$pid" 2>/dev/null || true; done
  kill_cgroup_procs
  host_down
  rm -rf --one-file-system "$NODE" 2>/dev/null || { sleep 1; host_down; rm -rf --one-file-system "$NODE"; }
  [ "$(cat "$OWNER" 2>/dev/null)" = "$NODE" ] && rm -f "$OWNER"
  return 0
}

cmd_down() {
  [ "$(id -u)" = 0 ] || die "needs root"
  lock_node
  if [ ! -d "$NODE" ]; then
    log "nothing to stop ($NODE does not exist)"
    return 0
  fi
  if "$CP" status >/dev/null 2>&1; then
    load_cp
    # The Node object and its pods (the API server would otherwise keep them, and
    # their namespaces could not finish deleting).
    kubectl_admin delete node "$NODE_NAME" --wait=false >/dev/null 2>&1 || true
    kubectl_admin delete pods --all-namespaces --field-selector "spec.nodeName=$NODE_NAME" --force --grace-period=0 \
      --wait=false >/dev/null 2>&1 || true
  else
    BIN="$("$CP" bindir)"
  fi
  teardown
  log "stopped; removed $NODE"
}

cmd_status() {
  if ! load_ports; then
    echo "down (no node state in $NODE)"
    return 3
  fi
  load_cp
  local c rc=0
  for c in "${COMPONENTS[@]}"; do
    if ! running "$c"; then
      printf '%-16s not running\n' "$c"; rc=3
    elif probe "$c"; then
      printf '%-16s running (pid %s), healthy\n' "$c" "$(pid_of "$c")"
    else
      printf '%-16s running (pid %s), NOT healthy\n' "$c" "$(pid_of "$c")"; rc=3
    fi
  done
  local ready
  ready="$(kubectl_admin get node "$NODE_NAME" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null || true)"
  echo "node $NODE_NAME: Ready=${ready:-unknown}   address $NODE_IP   pods $POD_CIDR   state $NODE"
  [ "$ready" = True ] || rc=3
  if ! cmp -s "$NODE/pki/ca.crt" "$PKI/ca.crt"; then
    echo "its credentials are not from the running control plane's CA ($0 up replaces the node)"
    rc=3
  fi
  return $rc
}

print_env() {
  echo "export KUBECONFIG=$KUBECONFIG_ADMIN DISTRAIN_KUBE_BINDIR=$BIN DISTRAIN_NODE_NAME=$NODE_NAME DISTRAIN_NODE_IP=$NODE_IP"
}

cmd_import() {
  [ $# -gt 0 ] || die "usage: import ARCHIVE..."
  running containerd || die "the node is not up ($0 up)"
  local a
  for a in "$@"; do
    [ -f "$a" ] || die "$a: no such image archive"
    ctr_node images import --all-platforms "$a" >/dev/null || die "importing $a into the node's containerd failed"
    log "imported $a"
  done
}

# The worker and operator images as scripts/build-images.sh builds them,
# exported as OCI archives (cached under $CACHE/images/oci, each with the image
# ID it holds) and imported; an image whose ID the archive or the node already
# has is not exported or imported again.
cmd_load_images() {
  local build_dir="" tag=dev
  while [ $# -gt 0 ]; do
    case "$1" in
      --build-dir) build_dir="${2:?--build-dir needs a value}"; shift 2 ;;
      --tag) tag="${2:?--tag needs a value}"; shift 2 ;;
      *) die "load-images: unknown option '$1' (use --build-dir DIR, --tag TAG)" ;;
    esac
  done
  running containerd || die "the node is not up ($0 up)"
  # The node has no GPU: the CUDA variant of the worker is not built here.
  local out="$CACHE/images/oci" args=(--tag "$tag" --no-cuda) storage name image id archive
  [ -z "$build_dir" ] || args+=(--build-dir "$build_dir")
  "$ROOT/scripts/build-images.sh" "${args[@]}" >/dev/null || die "scripts/build-images.sh ${args[*]} failed (its messages are above)"
  read -r -a storage < <("$ROOT/scripts/build-images.sh" --print-storage)
  mkdir -p "$out" "$NODE/images"
  for name in worker operator; do
    image="localhost/distrain/$name:$tag"
    id="$(buildah "${storage[@]}" inspect --type image --format '{{.FromImageID}}' "$image" 2>/dev/null)" ||
      die "scripts/build-images.sh made no $image (is the $name binary built?)"
    archive="$out/distrain-$name-$tag.oci.tar"
    if [ ! -f "$archive" ] || [ "$(cat "$archive.id" 2>/dev/null)" != "$id" ]; then
      rm -f "$archive" "$archive.id"
      buildah "${storage[@]}" push --quiet "$image" "oci-archive:$archive:$image" >/dev/null ||
        die "exporting $image to $archive failed"
      echo "$id" >"$archive.id"
    fi
    if [ "$(cat "$NODE/images/$name-$tag.id" 2>/dev/null)" = "$id" ] && ctr_node images ls -q | grep -x "$image" >/dev/null; then
      log "$image: already in the node's containerd"
    else
      cmd_import "$archive"
      echo "$id" >"$NODE/images/$name-$tag.id"
    fi
  done
}

case "${1:-}" in
  build) cmd_build ;;
  up) cmd_up ;;
  down) cmd_down ;;
  status) cmd_status ;;
  env) load_cp; print_env ;;
  import) shift; cmd_import "$@" ;;
  load-images) shift; cmd_load_images "$@" ;;
  ctr) shift; exec ctr --address "$SOCK" --namespace k8s.io "$@" ;;
  -h | --help | help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0" ;;
  *) echo "usage: $0 build|up|down|status|env|load-images [--build-dir DIR] [--tag TAG]|import ARCHIVE...|ctr ARGS... (see --help)" >&2; exit 2 ;;
esac
