#!/usr/bin/env bash
# Kube tier: the Helm chart (charts/distrain) with a real helm against the real
# control plane of scripts/control-plane.sh.
#
# Checks, each printed as it runs:
#   1. `helm lint --strict` passes, with default values and with watchNamespaces;
#   2. values.schema.json rejects bad values at install time, naming the key;
#   3. `helm template` renders: a Deployment whose pod passes the "restricted"
#      Pod Security Standard (server-side dry run in a namespace that enforces it),
#      probes on /healthz and /readyz, leader-election flags; RoleBindings
#      instead of a ClusterRoleBinding when watchNamespaces is set;
#   4. `helm install` for real creates the objects; the operator's
#      ServiceAccount can do exactly what the reconciler needs and nothing more
#      (kubectl auth can-i as the ServiceAccount: pods create yes, secrets get no, ...);
#   5. the Grafana dashboard ConfigMap holds valid JSON whose queries use the
#      metric names the worker and the operator export;
#   6. `helm uninstall` removes what install created.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
CP=scripts/control-plane.sh
NS="distrain-helm-test-$$"
NS_RESTRICTED="distrain-helm-restricted-$$"
REL=dt
started_cluster=0
checks=0
say() { printf '[helm-test] %s\n' "$*"; }
fail() { printf '[helm-test] FAIL: %s\n' "$*" >&2; exit 1; }
pass() { checks=$((checks + 1)); printf '[helm-test]   ok: %s\n' "$*"; }
cleanup() {
  local rc=$?
  if [ -n "${KUBECTL:-}" ]; then
    "$HELM" uninstall "$REL" -n "$NS" >/dev/null 2>&1 || true
    "$KUBECTL" delete namespace "$NS" "$NS_RESTRICTED" --ignore-not-found --wait=false >/dev/null 2>&1 || true
  fi
  [ "$started_cluster" = 1 ] && "$CP" down >/dev/null 2>&1
  exit $rc
}
trap cleanup EXIT

HELM="$("$CP" helmbin)" || fail "no helm (scripts/control-plane.sh build builds it)"
CHART=charts/distrain
# helm template has no cluster to ask; render for the control plane's version.
KUBE_VERSION="$(awk -F= '/^K8S_VERSION=/ {print $2; exit}' "$CP")"

# 1. lint
"$HELM" lint --strict --kube-version "$KUBE_VERSION" "$CHART" >/tmp/helm-lint.$$ 2>&1 || { cat /tmp/helm-lint.$$; fail "helm lint --strict"; }
"$HELM" lint --strict --kube-version "$KUBE_VERSION" "$CHART" --set 'operator.watchNamespaces={team-a,team-b}' >/dev/null 2>&1 ||
  fail "helm lint with watchNamespaces"
pass "helm lint --strict (defaults, watchNamespaces)"

# 2. schema
expect_reject() {  # expect_reject "substring" helm-template-args...
  local want="$1" out
  shift
  if out="$("$HELM" template --kube-version "$KUBE_VERSION" "$REL" "$CHART" "$@" 2>&1)"; then fail "helm accepted $* (expected: $want)"; fi
  grep -qF -- "$want" <<<"$out" || fail "helm rejected $* but without '$want': $out"
}
expect_reject "replicaCount" --set replicaCount=0
expect_reject "additional properties 'bogus' not allowed" --set bogus=1
expect_reject "pullPolicy" --set image.pullPolicy=Sometimes
expect_reject "leaderElection.enabled=true" --set replicaCount=2 --set operator.leaderElection.enabled=false
pass "values.schema.json rejects bad values, naming the key"

# 3. render
out="$("$HELM" template --kube-version "$KUBE_VERSION" "$REL" "$CHART" -n "$NS")" || fail "helm template"
for want in "kind: Deployment" "path: /healthz" "path: /readyz" "--leader-elect" "kind: ClusterRoleBinding" \
  "runAsNonRoot: true" "readOnlyRootFilesystem: true" "--metrics-bind-address=:8080"; do
  grep -qF -- "$want" <<<"$out" || fail "helm template output lacks '$want'"
done
out_ns="$("$HELM" template --kube-version "$KUBE_VERSION" "$REL" "$CHART" -n "$NS" --set 'operator.watchNamespaces={team-a,team-b}')"
[ "$(grep -c '^kind: RoleBinding' <<<"$out_ns")" = 3 ] || fail "watchNamespaces: want 2 RoleBindings + the leader-election one"
grep -q '^kind: ClusterRoleBinding' <<<"$out_ns" && fail "watchNamespaces must not bind cluster-wide"
grep -qF -- "--namespaces=team-a,team-b" <<<"$out_ns" || fail "watchNamespaces not passed to the operator"
mon="$("$HELM" template --kube-version "$KUBE_VERSION" "$REL" "$CHART" -n "$NS" \
  --api-versions monitoring.coreos.com/v1/ServiceMonitor --api-versions monitoring.coreos.com/v1/PodMonitor \
  --set metrics.serviceMonitor.enabled=true --set metrics.podMonitor.enabled=true --set metrics.prometheusRelease=kps)"
[ "$(grep -c 'release: "kps"' <<<"$mon")" = 2 ] || fail "ServiceMonitor and PodMonitor must carry the configured release label"
grep -q 'kind: PodMonitor' <<<"$mon" || fail "no PodMonitor rendered"
nomon="$("$HELM" template --kube-version "$KUBE_VERSION" "$REL" "$CHART" -n "$NS" \
  --set metrics.serviceMonitor.enabled=true --set metrics.podMonitor.enabled=true)"
grep -q 'kind: ServiceMonitor' <<<"$nomon" && fail "monitors must not render without the Prometheus Operator CRDs"
pass "helm template renders the operator, probes, restricted security context, namespace-scoped RBAC, monitors with the release label only where their CRDs exist"

if "$CP" status >/dev/null 2>&1; then
  say "reusing the running control plane"
else
  say "starting the control plane"
  started_cluster=1
  "$CP" up >/dev/null || fail "scripts/control-plane.sh up failed"
fi
KUBECTL="$("$CP" bindir)/kubectl"
export KUBECONFIG
KUBECONFIG="$("$CP" kubeconfig)"

# The Deployment's pod template must pass the restricted Pod Security Standard:
# the API server warns on workload objects whose pods would be rejected.
"$KUBECTL" create namespace "$NS_RESTRICTED" >/dev/null
"$KUBECTL" label namespace "$NS_RESTRICTED" pod-security.kubernetes.io/enforce=restricted \
  pod-security.kubernetes.io/warn=restricted >/dev/null
"$HELM" template --kube-version "$KUBE_VERSION" "$REL" "$CHART" -n "$NS_RESTRICTED" --show-only templates/deployment.yaml |
  "$KUBECTL" apply -n "$NS_RESTRICTED" --dry-run=server -f - >/tmp/helm-psa.$$ 2>&1 ||
  { cat /tmp/helm-psa.$$; fail "server-side dry run of the Deployment"; }
grep -qi "violate PodSecurity" /tmp/helm-psa.$$ && { cat /tmp/helm-psa.$$; fail "the operator pod violates the restricted Pod Security Standard"; }
pass "the operator's pod passes Pod Security 'restricted' (server-side dry run, no warning)"

# 4. install for real (no nodes: the pods stay Pending; the objects are what counts)
"$HELM" install "$REL" "$CHART" -n "$NS" --create-namespace >/tmp/helm-install.$$ 2>&1 ||
  { cat /tmp/helm-install.$$; fail "helm install"; }
for obj in deployment/$REL-distrain-operator serviceaccount/$REL-distrain service/$REL-distrain-operator-metrics \
  role/$REL-distrain-leader-election rolebinding/$REL-distrain-leader-election configmap/$REL-distrain-dashboard; do
  "$KUBECTL" -n "$NS" get "$obj" >/dev/null 2>&1 || fail "helm install did not create $obj"
done
"$KUBECTL" get clusterrole/$REL-distrain-operator clusterrolebinding/$REL-distrain-operator >/dev/null 2>&1 ||
  fail "helm install did not create the operator's ClusterRole/Binding"
pass "helm install creates the Deployment, ServiceAccount, RBAC, metrics Service and dashboard"

SA="system:serviceaccount:$NS:$REL-distrain"
can() {  # can yes|no VERB RESOURCE [-n NS] ...
  local want="$1"
  shift
  local got
  got="$("$KUBECTL" auth can-i --as="$SA" "$@" 2>/dev/null)"
  [ "$got" = "$want" ] || fail "ServiceAccount can-i $*: got '$got', want '$want'"
}
for r in "create pods" "delete pods" "watch pods" "create services" "list distributedtrainingjobs.distrain.io" \
  "update distributedtrainingjobs.distrain.io --subresource=status" "delete distributedtrainingjobs.distrain.io" \
  "create events.events.k8s.io" "watch configmaps" "create configmaps" "update configmaps"; do
  can yes $r -n default
done
can yes create leases.coordination.k8s.io -n "$NS"
can yes update leases.coordination.k8s.io -n "$NS"
for r in "get secrets" "list secrets" "create deployments.apps" "update distributedtrainingjobs.distrain.io" \
  "create distributedtrainingjobs.distrain.io" "update pods" "patch pods" "create pods --subresource=exec" "delete configmaps" \
  "create rolebindings.rbac.authorization.k8s.io" "get nodes" "list customresourcedefinitions.apiextensions.k8s.io"; do
  can no $r -n default
done
can no create leases.coordination.k8s.io -n default
pass "the operator's ServiceAccount can do what reconciling needs and nothing more (24 can-i checks; podgroups need their CRD to resolve)"

# 5. dashboard
"$KUBECTL" -n "$NS" get configmap "$REL-distrain-dashboard" -o jsonpath='{.data.distrain\.json}' >/tmp/helm-dash.$$.json
python3 - /tmp/helm-dash.$$.json <<'PY' || fail "dashboard check (above)"
import json, re, sys
d = json.load(open(sys.argv[1]))
exprs = [t["expr"] for p in d["panels"] for t in p.get("targets", [])]
names = set(re.findall(r"\b((?:distrain|controller_runtime|workqueue|rest_client|leader_election)_[a-z_]+)", " ".join(exprs)))
worker = {"distrain_steps_total", "distrain_examples_total", "distrain_loss", "distrain_step_duration_seconds_bucket",
          "distrain_collective_bytes_total", "distrain_ps_rpc_seconds_bucket"}
operator = {"controller_runtime_reconcile_total", "workqueue_depth", "rest_client_requests_total", "leader_election_master_status"}
missing = (worker | operator) - names
if missing:
    sys.exit("dashboard lacks panels for " + ", ".join(sorted(missing)))
print(f"[helm-test]   dashboard: {len(d['panels'])} panels, {len(names)} metric names")
PY
pass "the Grafana dashboard is valid JSON and graphs the worker's and the operator's metrics"

# 6. uninstall
"$HELM" uninstall "$REL" -n "$NS" --wait >/dev/null 2>&1 || fail "helm uninstall"
"$KUBECTL" -n "$NS" get deployment "$REL-distrain-operator" >/dev/null 2>&1 && fail "uninstall left the Deployment"
"$KUBECTL" get clusterrole "$REL-distrain-operator" >/dev/null 2>&1 && fail "uninstall left the ClusterRole"
pass "helm uninstall removes what install created"
rm -f /tmp/helm-*.$$ /tmp/helm-*.$$.json
say "all $checks checks passed"
