#!/usr/bin/env bash
# The chart's Prometheus scrape configuration (templates/prometheus-scrape-config.yaml)
# renders to scrape_configs that Prometheus' own promtool accepts: with the
# defaults, with watchNamespaces and with kubernetesSD for a Prometheus outside
# the cluster; it keeps only the pods' port named "metrics" and adds the labels
# the dashboard filters on; metrics.scrapeConfig.enabled=false renders nothing.
# No cluster: `helm template` and `promtool check config`. Skips (77) when helm
# (scripts/control-plane.sh build) or Prometheus (scripts/prometheus.sh build)
# is not built; e2e.prometheus_dashboard runs the configuration for real.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
HELM="$("$ROOT/scripts/control-plane.sh" helmbin 2>/dev/null)"
PROMTOOL="$("$ROOT/scripts/prometheus.sh" bindir)/promtool"
[ -x "$HELM" ] || { echo "SKIP: helm is not built (scripts/control-plane.sh build)"; exit 77; }
[ -x "$PROMTOOL" ] || { echo "SKIP: promtool is not built (scripts/prometheus.sh build)"; exit 77; }
T="$(mktemp -d)"
trap 'rm -rf "$T"' EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

# render NAME HELM_ARGS...: the ConfigMap's scrape-configs.yaml as a prometheus.yml in $T/NAME.yml.
render() {
  local name="$1"
  shift
  "$HELM" template rel "$ROOT/charts/distrain" -n ops --kube-version 1.36.0 \
    --show-only templates/prometheus-scrape-config.yaml "$@" >"$T/$name.cm.yaml" 2>"$T/$name.err" ||
    { fail "$name: helm template: $(cat "$T/$name.err")"; return 1; }
  python3 - "$T/$name.cm.yaml" "$T/$name.yml" <<'PY' || { fail "$name: not a ConfigMap with scrape-configs.yaml"; return 1; }
import sys, yaml
cm = yaml.safe_load(open(sys.argv[1]))
assert cm["kind"] == "ConfigMap" and cm["metadata"]["name"] == "rel-distrain-prometheus-scrape", cm["metadata"]
with open(sys.argv[2], "w") as f:
    f.write("scrape_configs:\n" + cm["data"]["scrape-configs.yaml"])
PY
  "$PROMTOOL" check config "$T/$name.yml" >"$T/$name.check" 2>&1 ||
    { fail "$name: promtool check config: $(cat "$T/$name.check")"; return 1; }
}

# check NAME PYTHON: asserts over the parsed scrape_configs (list `sc`, dict `by_job`).
check() {
  python3 - "$T/$1.yml" "$2" <<'PY'
import sys, yaml
sc = yaml.safe_load(open(sys.argv[1]))["scrape_configs"]
by_job = {c["job_name"]: c for c in sc}
def targets(job, label):
    return [r.get("target_label") for r in by_job[job]["relabel_configs"]
            if r.get("source_labels") == [label]]
exec(sys.argv[2])
PY
}

if render defaults; then
  check defaults '
assert sorted(by_job) == ["distrain-operator", "distrain-training"], sorted(by_job)
tr, op = by_job["distrain-training"], by_job["distrain-operator"]
assert tr["kubernetes_sd_configs"] == [{"role": "pod", "selectors": [{"role": "pod", "label": "distrain.io/job-name"}]}], tr["kubernetes_sd_configs"]
assert op["kubernetes_sd_configs"][0]["namespaces"] == {"names": ["ops"]}
assert "app.kubernetes.io/instance=rel" in op["kubernetes_sd_configs"][0]["selectors"][0]["label"]
for job in by_job:
    keep = [r for r in by_job[job]["relabel_configs"] if r.get("action") == "keep"]
    assert {"source_labels": ["__meta_kubernetes_pod_container_port_name"], "regex": "metrics", "action": "keep"} in keep, job
    assert targets(job, "__meta_kubernetes_namespace") == ["namespace"], job
    assert targets(job, "__meta_kubernetes_pod_name") == ["pod"], job
assert targets("distrain-training", "__meta_kubernetes_pod_label_distrain_io_job_name") == ["job_name"]
assert targets("distrain-training", "__meta_kubernetes_pod_label_distrain_io_replica_type") == ["replica_type"]
assert targets("distrain-training", "__meta_kubernetes_pod_label_distrain_io_replica_index") == ["replica_index"]
assert tr["scrape_interval"] == "15s" and op["scrape_interval"] == "30s"
' && echo "ok: defaults: promtool accepts it; port 'metrics' kept; namespace, pod, job_name, replica_type, replica_index added" ||
    fail "defaults: the assertions above"
fi

if render outside --set 'operator.watchNamespaces={team-a,team-b}' --set metrics.scrapeConfig.interval=5s \
  --set-json 'metrics.scrapeConfig.kubernetesSD={"api_server":"https://10.0.0.1:6443","tls_config":{"ca_file":"/etc/ca.crt"}}'; then
  check outside '
for job, c in by_job.items():
    sd = c["kubernetes_sd_configs"][0]
    assert sd["api_server"] == "https://10.0.0.1:6443" and sd["tls_config"] == {"ca_file": "/etc/ca.crt"}, (job, sd)
    assert sd["role"] == "pod", (job, sd)
assert by_job["distrain-training"]["kubernetes_sd_configs"][0]["namespaces"] == {"names": ["team-a", "team-b"]}
assert by_job["distrain-training"]["scrape_interval"] == "5s"
' && echo "ok: watchNamespaces and kubernetesSD (api_server, tls_config) reach every kubernetes_sd_configs entry" ||
    fail "outside: the assertions above"
fi

out="$("$HELM" template rel "$ROOT/charts/distrain" --kube-version 1.36.0 --set metrics.scrapeConfig.enabled=false 2>&1)"
if grep -q prometheus-scrape <<<"$out"; then
  fail "metrics.scrapeConfig.enabled=false still renders the ConfigMap"
else
  echo "ok: metrics.scrapeConfig.enabled=false renders no ConfigMap"
fi

[ "$failures" = 0 ] || { echo "$failures failure(s)"; exit 1; }
echo PASS
