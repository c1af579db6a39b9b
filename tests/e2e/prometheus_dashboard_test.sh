#!/usr/bin/env bash
# e2e: a real Prometheus fills every panel of the chart's Grafana dashboard
# while jobs train, scraping the cluster only through what the chart ships: its
# scrape configuration (ConfigMap <release>-distrain-prometheus-scrape,
# kubernetes service discovery of pods against the API server). The server is
# upstream's, built from its pinned Go module (scripts/prometheus.sh): Debian
# 12's prometheus package is built without kubernetes service discovery.
#   tests/e2e/with_node.sh bash tests/e2e/prometheus_dashboard_test.sh BUILD_DIR
#
#   1. `helm install charts/distrain` (defaults, but 2 s scrape intervals and
#      the API server's address for a Prometheus outside the cluster); the
#      operator runs as a pod on the real node and leads;
#   2. Prometheus runs with the scrape_configs read back from the installed
#      ConfigMap (promtool checks it first);
#   3. a MultiWorkerMirrored job, asked for as Auto (collectives, membership,
#      Auto's choice) and a
#      ParameterServer job with an Evaluator (ps RPCs, traffic, staleness,
#      evaluation) train, checkpointing often;
#   4. every query of every panel and every query variable in
#      charts/distrain/dashboards/*.json, as Grafana sends it with the
#      namespace and both jobs selected, returns a finite sample through
#      /api/v1/query (tests/e2e/dashboard_queries.py); the test fails naming
#      each empty panel. The one panel a CPU node cannot fill (Auto's measured
#      GPU bandwidths) must still evaluate;
#   5. the Auto job's status.strategy is its master's choice (decidedBy: worker). A query of a series nobody exports must come back
#      empty (the checker's own control).
# Everything runs in one namespace under the restricted Pod Security Standard;
# the pods run on the real node (scripts/node.sh) and Prometheus, a host
# process, scrapes them on their pod IPs across the node's bridge. Needs root and scripts/prometheus.sh build; skips (77)
# without root. E2E_KEEP=1 keeps the logs and Prometheus' data.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BUILD="$(cd "${1:?usage: prometheus_dashboard_test.sh BUILD_DIR}" && pwd)"
: "${KUBECONFIG:?run through tests/e2e/with_node.sh}"
KUBECTL="${DISTRAIN_KUBE_BINDIR:?}/kubectl"
CP="${DISTRAIN_CONTROL_PLANE:-$ROOT/scripts/control-plane.sh}"
WAIT_S="${E2E_WAIT_S:-150}"

# shellcheck source=tests/e2e/e2e_lib.sh
. "$ROOT/tests/e2e/e2e_lib.sh"
e2e_preflight
HELM="$("$CP" helmbin 2>/dev/null)" || { echo "FAIL: no helm (scripts/control-plane.sh build builds it)"; exit 1; }
PROM_BIN="$("$ROOT/scripts/prometheus.sh" bindir)"
[ -x "$PROM_BIN/prometheus" ] || { echo "FAIL: Prometheus is not built in $PROM_BIN (scripts/prometheus.sh build)"; exit 1; }
NS="e2e-prom-$$"
REL="dp$$"
WORK="$(mktemp -d /tmp/distrain-e2e-prom.XXXXXX)"
k() { "$KUBECTL" -n "$NS" "$@"; }
FAILED=0
dump() {
  echo "--- kubectl get pods,dtj -o wide"
  k get pods,dtj -o wide 2>&1
  echo "--- prometheus targets"
  curl -fsS "${E2E_PROMETHEUS_URL:-http://127.0.0.1:0}/api/v1/targets" 2>&1 | python3 -c '
import json, sys
for t in json.load(sys.stdin)["data"]["activeTargets"]:
    print(t["labels"].get("job"), t["scrapeUrl"], t["health"], t.get("lastError", ""))' 2>&1
  local p
  for p in $(k get pods -o name 2>/dev/null); do
    echo "--- kubectl logs $p (last 10 lines)"
    k logs "$p" --tail=10 2>&1
  done
  echo "--- prometheus.log (last 10 lines)"
  tail -n 10 "$WORK/prometheus/prometheus.log" 2>&1
}
fail() {
  echo "FAIL: $*"
  FAILED=1
  dump
  exit 1
}
cleanup() {
  "$KUBECTL" -n "$NS" delete dtj --all --wait=false >/dev/null 2>&1
  "$HELM" uninstall "$REL" -n "$NS" >/dev/null 2>&1
  "$KUBECTL" delete namespace "$NS" --wait=false >/dev/null 2>&1
  e2e_stop
  if [ "$FAILED" != 0 ] || [ -n "${E2E_KEEP:-}" ]; then
    echo "--- logs kept in $WORK (prometheus/); the node's in ${DISTRAIN_NODE_DIR:-/tmp/distrain-node}/logs"
  else
    rm -rf "$WORK"
  fi
}
trap cleanup EXIT

start=$SECONDS
e2e_namespace "$NS" || fail "cannot create namespace $NS enforcing the restricted Pod Security Standard"
e2e_load_images || fail "loading the images into the node (scripts/node.sh load-images)"

# 1. The chart, as installed by a user, plus what a Prometheus outside the
# cluster needs to reach the API server; 2 s intervals so the test is short.
e2e_helm_install "$REL" "$NS" --set replicaCount=1 \
  --set metrics.scrapeConfig.interval=2s --set metrics.scrapeConfig.operatorInterval=2s \
  --set-json "metrics.scrapeConfig.kubernetesSD={\"kubeconfig_file\":\"$KUBECONFIG\"}" \
  >"$WORK/install.log" 2>&1 || { cat "$WORK/install.log"; fail "helm install"; }
leader="$(e2e_wait_leader "$REL-distrain-operator" "$NS" 60)" || fail "no operator pod took the Lease within 60 s"
echo "ok: helm install: the operator pod $leader leads"

# 2. Prometheus with the chart's scrape configuration, read back from the cluster.
k get configmap "$REL-distrain-prometheus-scrape" -o jsonpath='{.data.scrape-configs\.yaml}' >"$WORK/scrape-configs.yaml" &&
  [ -s "$WORK/scrape-configs.yaml" ] || fail "the chart installed no ConfigMap $REL-distrain-prometheus-scrape"
e2e_start_prometheus "$WORK" "$WORK/scrape-configs.yaml" || fail "prometheus did not start"
echo "ok: prometheus on $E2E_PROMETHEUS_URL with the chart's scrape_configs ($(grep -c 'job_name:' "$WORK/scrape-configs.yaml") jobs)"

# 3. Two jobs that keep training while the dashboard is checked (deleted at
# the end), checkpointing every second or so (they take 1-3k steps/s here) so
# the checkpoint panel moves.
cat >"$WORK/jobs.yaml" <<'YAML'
apiVersion: distrain.io/v1alpha1
kind: DistributedTrainingJob
metadata: {name: mwms}
spec:
  strategy: Auto            # two training tasks: MultiWorkerMirrored, and the Auto panel fills
  replicaSpecs:
    Chief: {replicas: 1}
    Worker: {replicas: 1}
  training:
    model: {hiddenUnits: [16]}
    dataset: {type: synthetic, numExamples: 2000, numEvalExamples: 200, numFeatures: 16, numClasses: 4, autoShardPolicy: DATA}
    optimizer: {type: adam, learningRate: 0.001}
    checkpoint: {everySteps: 2000}
    globalBatchSize: 16
    steps: 10000000
    logEverySteps: 5000
    evalEverySteps: 2000
---
apiVersion: distrain.io/v1alpha1
kind: DistributedTrainingJob
metadata: {name: ps}
spec:
  strategy: ParameterServer
  replicaSpecs:
    Chief: {replicas: 1}
    Worker: {replicas: 1}
    PS: {replicas: 1}
    Evaluator: {replicas: 1}
  training:
    model: {hiddenUnits: [16]}
    dataset: {type: synthetic, numExamples: 2000, numEvalExamples: 200, numFeatures: 16, numClasses: 4}
    optimizer: {type: adam, learningRate: 0.001}
    checkpoint: {everySteps: 500}
    globalBatchSize: 16
    steps: 10000000
    logEverySteps: 5000
YAML
k apply -f "$WORK/jobs.yaml" >/dev/null || fail "kubectl apply the jobs"
t_apply=$SECONDS
for job in mwms ps; do
  k wait --for=condition=Running "dtj/$job" --timeout="${WAIT_S}s" >/dev/null || fail "$job: not Running within ${WAIT_S}s"
done
echo "ok: mwms and ps Running ($((SECONDS - t_apply)) s after apply)"

# 4. Every panel, as Grafana queries it with this namespace and both jobs selected.
t_check=$SECONDS
python3 "$ROOT/tests/e2e/dashboard_queries.py" --prometheus "$E2E_PROMETHEUS_URL" --timeout "$WAIT_S" \
  --var "namespace=$NS" --var "job=(mwms|ps)" \
  --expect-empty "distrain_steps_total{namespace=\"$NS\", job_name=\"no-such-job\"}" \
  --no-data-expected "Auto: measured copy bandwidth=measured only by a worker that sees several GPUs" \
  "$ROOT"/charts/distrain/dashboards/*.json || fail "dashboard panels without data (above)"
echo "ok: every dashboard query has data ($((SECONDS - t_check)) s after the jobs ran)"

# Auto's choice as the master made it reaches the job's status (the operator's
# progress reporter copies it from the same /metrics).
decided=""
for _ in $(seq 1 30); do
  decided=$(k get dtj mwms -o jsonpath='{.status.strategy.decidedBy}/{.status.strategy.name}' 2>/dev/null)
  [ "$decided" = "worker/MultiWorkerMirrored" ] && break
  sleep 1
done
[ "$decided" = "worker/MultiWorkerMirrored" ] ||
  fail "status.strategy of the Auto job is '$decided', want the master's choice: worker/MultiWorkerMirrored"
echo "ok: status.strategy of the Auto job is the master's choice ($decided)"

echo "PASS ($((SECONDS - start)) s)"
