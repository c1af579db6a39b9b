# Shared by the e2e tests and scripts/quickstart.sh --kube: start the test node
# agent and the operator against the developer control plane. Source it with
# ROOT (the repository) and BUILD (the build directory) set and KUBECONFIG
# exported; it defines functions only.
#
#   e2e_preflight                          exits 77 (skip) unless root, 1 unless the agent,
#                                          operator and worker are built in BUILD
#   e2e_start_node STATE_DIR [NAMESPACE]   the node agent (needs root: /etc/hosts);
#                                          pids under STATE_DIR/pids, logs under STATE_DIR/logs;
#                                          more agent flags in the array E2E_NODE_ARGS
#   e2e_start_operator LOG [NAMESPACE]     the operator as a local process (admin kubeconfig)
#   e2e_stop                               stops what the two started (their pids only)
#   e2e_example FILE STEPS                 prints FILE with its training shortened to STEPS
#                                          steps and at most 8000 examples (for speed)
#   e2e_helm_install REL NS [ARGS...]      helm-installs charts/distrain as a user would, the
#                                          operator then running as a pod on the test node
#                                          (HELM: the helm binary); ARGS go to helm install
#   e2e_wait_leader LEASE NS SECONDS       waits until a pod holds the operator's Lease (the
#                                          chart names it <fullname>-operator); prints the
#                                          pod's name (holder identity <hostname>_<uuid>)
#   e2e_start_prometheus STATE_DIR SCRAPE  Prometheus (scripts/prometheus.sh build) on a free
#                                          127.0.0.1 port with the scrape_configs list in file
#                                          SCRAPE (the chart's ConfigMap), data under
#                                          STATE_DIR/prometheus; sets E2E_PROMETHEUS_URL;
#                                          e2e_stop stops it

E2E_PIDS=()
E2E_NODE_ARGS=()

e2e_preflight() {
  if [ "$(id -u)" != 0 ]; then
    echo "SKIP: the test node agent needs root (it manages /etc/hosts and mounts pod volumes)"
    exit 77
  fi
  local b
  for b in tests/e2e/distrain-test-node operator/distrain-operator worker/distrain-worker; do
    [ -x "$BUILD/$b" ] || { echo "FAIL: $BUILD/$b is not built (ninja -C $BUILD $(basename "$b"))"; exit 1; }
  done
}

e2e_start_node() {
  local state="$1" ns="${2:-}"
  mkdir -p "$state"
  local args=(--kubeconfig "$KUBECONFIG" --state-dir "$state"
    --image-map "localhost/distrain/worker=$BUILD/worker/distrain-worker"
    --image-map "localhost/distrain/operator=$BUILD/operator/distrain-operator")
  [ -n "$ns" ] && args+=(--namespace "$ns")
  args+=("${E2E_NODE_ARGS[@]}")
  "$BUILD/tests/e2e/distrain-test-node" "${args[@]}" >"$state/agent.log" 2>&1 &
  E2E_PIDS+=($!)
  E2E_NODE_PID=$!
  local i
  for i in $(seq 1 100); do
    if grep -q "ready; kubelet endpoint" "$state/agent.log" 2>/dev/null; then return 0; fi
    kill -0 "$E2E_NODE_PID" 2>/dev/null || break
    sleep 0.2
  done
  echo "[e2e] the node agent did not start; its log:" >&2
  cat "$state/agent.log" >&2
  return 1
}

e2e_start_operator() {
  local log="$1" ns="${2:-}"
  local args=(--kubeconfig "$KUBECONFIG" --metrics-bind-address 0 --health-probe-bind-address 0)
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

# The operator binds its servers to its pod address (operator.listenOnPodIP):
# on the test node every pod shares the host's network namespace, so two
# replicas listening on :8080 would collide. It watches NS only, so it leaves
# other tests' jobs on a shared control plane alone.
e2e_helm_install() {
  local rel="$1" ns="$2"
  shift 2
  "$HELM" install "$rel" "$ROOT/charts/distrain" -n "$ns" --set operator.listenOnPodIP=true \
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
