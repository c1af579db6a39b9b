# Shared by the e2e tests and scripts/quickstart.sh --kube: jobs on the real node
# (scripts/node.sh: kubelet + containerd + CNI + CoreDNS on this machine), their
# pods from the images scripts/build-images.sh builds. Source it with ROOT (the
# repository) and BUILD (the build directory) set and KUBECONFIG exported (as
# tests/e2e/with_node.sh does); it defines functions only.
#
#   e2e_preflight                          exits 77 (skip) unless root, 1 unless the node
#                                          is up and the operator, worker and CLI are built
#   e2e_load_images                        the worker and operator images of BUILD, tagged
#                                          E2E_TAG (default e2e), into the node's containerd
#                                          (scripts/node.sh load-images: cached, seconds warm)
#   e2e_namespace NS                       creates NS enforcing the restricted Pod Security
#                                          Standard: every pod the operator makes must pass it
#   e2e_start_operator LOG [NAMESPACE]     the operator as a host process (admin kubeconfig),
#                                          its replicas' default image the imported worker
#   e2e_stop                               stops what this file started (its pids only)
#   e2e_example FILE STEPS                 prints FILE with its training shortened to STEPS
#                                          steps and at most 8000 examples (for speed)
#   e2e_helm_install REL NS [ARGS...]      helm-installs charts/distrain as a user would, the
#                                          operator then running as a pod from the imported
#                                          image and watching NS (HELM: the helm binary)
#   e2e_wait_leader LEASE NS SECONDS       waits until a pod holds the operator's Lease (the
#                                          chart names it <fullname>-operator); prints the
#                                          pod's name (holder identity <hostname>_<uuid>)
#   e2e_follow_log NS POD FILE             POD's log into FILE from its start until it ends
#                                          (run it in the background)
#   e2e_follow_incarnations NS POD DIR     every incarnation of POD (each pod uid) into
#                                          DIR/POD.<n>.log, n = 1, 2, ...; runs until killed
#                                          (run it in the background)
#   e2e_kill_container NS POD SIGNAL       sends SIGNAL to POD's first container through
#                                          containerd, as the OOM killer or a hang would
#   e2e_start_prometheus STATE_DIR SCRAPE  Prometheus (scripts/prometheus.sh build) on a free
#                                          127.0.0.1 port with the scrape_configs list in file
#                                          SCRAPE (the chart's ConfigMap), data under
#                                          STATE_DIR/prometheus; sets E2E_PROMETHEUS_URL;
#                                          e2e_stop stops it

#   k ARGS...                              kubectl in namespace $NS (set by the test)
#   fail MESSAGE / ok MESSAGE              a check's verdict, printed; fail counts in $failures

E2E_PIDS=()
failures=0
k() { "$KUBECTL" -n "$NS" "$@"; }
fail() {
  echo "FAIL: $*"
  failures=$((failures + 1))
}
ok() { echo "ok: $*"; }
E2E_TAG="${E2E_TAG:-e2e}"
E2E_WORKER_IMAGE="localhost/distrain/worker:$E2E_TAG"
E2E_NODE_SH="${DISTRAIN_NODE_SH:-$ROOT/scripts/node.sh}"

e2e_preflight() {
  if [ "$(id -u)" != 0 ]; then
    echo "SKIP: the real node (scripts/node.sh) needs root: namespaces, mounts, cgroups, iptables"
    exit 77
  fi
  local b
  for b in operator/distrain-operator worker/distrain-worker cli/distrain; do
    [ -x "$BUILD/$b" ] || { echo "FAIL: $BUILD/$b is not built (ninja -C $BUILD $(basename "$b"))"; exit 1; }
  done
  "$E2E_NODE_SH" status >/dev/null 2>&1 ||
    { echo "FAIL: the node is not up (run through tests/e2e/with_node.sh): $("$E2E_NODE_SH" status 2>&1 | tail -n 3)"; exit 1; }
}

e2e_load_images() {
  "$E2E_NODE_SH" load-images --build-dir "$BUILD" --tag "$E2E_TAG" >&2
}

e2e_namespace() {
  "$KUBECTL" create namespace "$1" >/dev/null &&
    "$KUBECTL" label namespace "$1" pod-security.kubernetes.io/enforce=restricted \
      pod-security.kubernetes.io/enforce-version=latest >/dev/null
}

e2e_start_operator() {
  local log="$1" ns="${2:-}"
  local args=(--kubeconfig "$KUBECONFIG" --metrics-bind-address 0 --health-probe-bind-address 0
    --worker-image "$E2E_WORKER_IMAGE")
  [ -n "$ns" ] && args+=(--namespaces "$ns")
  "$BUILD/operator/distrain-operator" "${args[@]}" >"$log" 2>&1 &
  E2E_PIDS+=($!)
  E2E_OPERATOR_PID=$!
}

e2e_stop() {
  local pid
  for pid in "${E2E_PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${E2E_PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  E2E_PIDS=()
}

e2e_example() {
  sed -E -e "s/^(    steps:) [0-9]+/\1 $2/" -e 's/^(      numExamples:) [0-9]+/\1 8000/' \
    -e 's/^(      numEvalExamples:) [0-9]+/\1 2000/' "$1"
}

# It watches NS only, so it leaves other tests' jobs on the shared cluster alone.
e2e_helm_install() {
  local rel="$1" ns="$2"
  shift 2
  "$HELM" install "$rel" "$ROOT/charts/distrain" -n "$ns" --set image.tag="$E2E_TAG" \
    --set "operator.watchNamespaces={$ns}" "$@"
}

e2e_wait_leader() {
  local lease="$1" ns="$2" secs="$3" holder="" i
  for i in $(seq 1 $((secs * 5))); do
    holder="$("$KUBECTL" -n "$ns" get lease "$lease" -o jsonpath='{.spec.holderIdentity}' 2>/dev/null)"
    holder="${holder%%_*}"
    if [ -n "$holder" ] && "$KUBECTL" -n "$ns" get pod "$holder" >/dev/null 2>&1; then
      echo "$holder"
      return 0
    fi
    sleep 0.2
  done
  return 1
}

# Before the container has started `kubectl logs -f` returns at once with
# nothing, so wait for a start first; give up after 5 minutes without one.
e2e_follow_log() {
  local ns="$1" pod="$2" file="$3" i started=""
  for i in $(seq 1 600); do
    started="$("$KUBECTL" -n "$ns" get pod "$pod" -o jsonpath='{.status.containerStatuses[0].state.running.startedAt}{.status.containerStatuses[0].state.terminated.startedAt}' 2>/dev/null)"
    [ -n "$started" ] && break
    sleep 0.5
  done
  [ -n "$started" ] && "$KUBECTL" -n "$ns" logs -f "$pod" >"$file" 2>&1
}

e2e_follow_incarnations() {
  local ns="$1" pod="$2" dir="$3" uid seen=" " n=0
  while true; do
    uid="$("$KUBECTL" -n "$ns" get pod "$pod" -o jsonpath='{.metadata.uid}' 2>/dev/null)"
    if [ -n "$uid" ] && [[ "$seen" != *" $uid "* ]]; then
      seen+="$uid "
      n=$((n + 1))
      e2e_follow_log "$ns" "$pod" "$dir/$pod.$n.log"
    fi
    sleep 0.5
  done
}

e2e_kill_container() {
  local ns="$1" pod="$2" signal="$3" cid
  cid="$("$KUBECTL" -n "$ns" get pod "$pod" -o jsonpath='{.status.containerStatuses[0].containerID}' 2>/dev/null)"
  cid="${cid#containerd://}"
  [ -n "$cid" ] || { echo "[e2e] $ns/$pod has no running container to send $signal" >&2; return 1; }
  "$E2E_NODE_SH" ctr tasks kill -s "$signal" "$cid"
}

e2e_start_prometheus() {
  local state="$1" scrape="$2" port i bin
  bin="$("$ROOT/scripts/prometheus.sh" bindir)"
  [ -x "$bin/prometheus" ] && [ -x "$bin/promtool" ] ||
    { echo "[e2e] Prometheus is not built in $bin (scripts/prometheus.sh build)" >&2; return 1; }
  mkdir -p "$state/prometheus"
  {
    printf 'global:\n  scrape_interval: 2s\n  scrape_timeout: 2s\n  evaluation_interval: 2s\nscrape_configs:\n'
    cat "$scrape"
  } >"$state/prometheus/prometheus.yml"
  "$bin/promtool" check config "$state/prometheus/prometheus.yml" >"$state/prometheus/check.log" 2>&1 ||
    { echo "[e2e] promtool check config failed:" >&2; cat "$state/prometheus/check.log" >&2; return 1; }
  port="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
  "$bin/prometheus" --config.file="$state/prometheus/prometheus.yml" --storage.tsdb.path="$state/prometheus/data" \
    --web.listen-address="127.0.0.1:$port" --storage.tsdb.retention.time=1h \
    >"$state/prometheus/prometheus.log" 2>&1 &
  E2E_PIDS+=($!)
  E2E_PROMETHEUS_URL="http://127.0.0.1:$port"
  for i in $(seq 1 100); do
    curl -fsS "$E2E_PROMETHEUS_URL/-/ready" >/dev/null 2>&1 && return 0
    sleep 0.2
  done
  echo "[e2e] prometheus did not become ready; its log:" >&2
  tail -n 20 "$state/prometheus/prometheus.log" >&2
  return 1
}
