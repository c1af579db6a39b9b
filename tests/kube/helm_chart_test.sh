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
#   3b. a PodDisruptionBudget and pod anti-affinity only with more than one
#      replica; NetworkPolicy flags and RBAC only with networkPolicy.enabled;
#   4. `helm install` for real creates the objects; the operator's
#      ServiceAccount can do exactly what the reconciler needs and nothing more,
#      printed as a table of `kubectl auth can-i` answers (as the
#      ServiceAccount, against the real API server), cluster-wide and, for a
#      second release with watchNamespaces, in the watched namespace only;
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
    "$HELM" uninstall dtns -n "$NS" >/dev/null 2>&1 || true
    "$KUBECTL" delete namespace "$NS" "$NS_RESTRICTED" "${NS_WATCHED:-$NS_RESTRICTED}" --ignore-not-found --wait=false >/dev/null 2>&1 || true
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
expect_reject "clusterDomain" --set operator.clusterDomain=Bad_Domain
pass "values.schema.json rejects bad values, naming the key"

# 3. render
out="$("$HELM" template --kube-version "$KUBE_VERSION" "$REL" "$CHART" -n "$NS")" || fail "helm template"
for want in "kind: Deployment" "path: /healthz" "path: /readyz" "--leader-elect" "kind: ClusterRoleBinding" \
  "runAsNonRoot: true" "readOnlyRootFilesystem: true" "--metrics-bind-address=:8080"; do
  grep -qF -- "$want" <<<"$out" || fail "helm template output lacks '$want'"
done
out_ns="$("$HELM" template --kube-version "$KUBE_VERSION" "$REL" "$CHART" -n "$NS" --set 'operator.watchNamespaces={team-a,team-b}')"
[ "$(grep -c '^kind: RoleBinding' <<<"$out_ns")" = 3 ] || fail "watchNamespaces: want 2 RoleBindings + the leader-election one"
[ "$(grep -c '^kind: Role$' <<<"$out_ns")" = 3 ] || fail "watchNamespaces: want a Role per namespace + the leader-election one"
# The one cluster-wide binding left is to the ClusterRole that reads the PodGroup CRD by name.
[ "$(grep -c '^kind: ClusterRoleBinding' <<<"$out_ns")" = 1 ] || fail "watchNamespaces: want only the CRD-read ClusterRoleBinding"
crds_role="$("$HELM" template --kube-version "$KUBE_VERSION" "$REL" "$CHART" -n "$NS" --set 'operator.watchNamespaces={team-a}' \
  --set rbac.aggregateToDefaultRoles=false --show-only templates/rbac.yaml | awk '/^kind: ClusterRole$/ {p=1} p && /^---/ {exit} p')"
grep -q "name: $REL-distrain-operator-crds" <<<"$crds_role" && [ "$(grep -c 'apiGroups:' <<<"$crds_role")" = 1 ] &&
  grep -q 'resourceNames: \[podgroups.scheduling.x-k8s.io\]' <<<"$crds_role" ||
  fail "watchNamespaces: the cluster-wide role must hold only 'get' of the PodGroup CRD by name: $crds_role"
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

# More than one replica: a PodDisruptionBudget and anti-affinity; one replica: neither.
grep -q '^kind: PodDisruptionBudget' <<<"$out" || fail "replicaCount 2: no PodDisruptionBudget"
grep -q 'minAvailable: 1' <<<"$out" || fail "replicaCount 2: PodDisruptionBudget without minAvailable 1"
grep -q 'preferredDuringSchedulingIgnoredDuringExecution' <<<"$out" && grep -q 'topologyKey: kubernetes.io/hostname' <<<"$out" ||
  fail "replicaCount 2: no preferred pod anti-affinity over hostnames"
one="$("$HELM" template --kube-version "$KUBE_VERSION" "$REL" "$CHART" -n "$NS" --set replicaCount=1)"
grep -q 'PodDisruptionBudget\|podAntiAffinity' <<<"$one" && fail "replicaCount 1 must get neither a PodDisruptionBudget nor anti-affinity"
req="$("$HELM" template --kube-version "$KUBE_VERSION" "$REL" "$CHART" -n "$NS" --set antiAffinity=required)"
grep -q 'requiredDuringSchedulingIgnoredDuringExecution' <<<"$req" || fail "antiAffinity=required not rendered"
own="$("$HELM" template --kube-version "$KUBE_VERSION" "$REL" "$CHART" -n "$NS" --set affinity.nodeAffinity.x=1)"
grep -q 'podAntiAffinity' <<<"$own" && fail "a user's affinity must replace the default anti-affinity"
# NetworkPolicies: the operator is told its own pods and metricsFrom as metrics peers, and gets RBAC for them.
grep -qF -- '--network-policy=true' <<<"$out" || fail "no --network-policy=true"
[ "$(grep -c -- '--network-policy-metrics-peer=' <<<"$out")" = 2 ] || fail "want 2 metrics peers (the operator, Prometheus)"
grep -F -- '--network-policy-metrics-peer=' <<<"$out" | grep -q "kubernetes.io/metadata.name.*$NS.*app.kubernetes.io/instance.*$REL" ||
  fail "the operator's own pods are not a metrics peer"
nonp="$("$HELM" template --kube-version "$KUBE_VERSION" "$REL" "$CHART" -n "$NS" --set networkPolicy.enabled=false)"
grep -q 'networkpolicies' <<<"$nonp" && fail "networkPolicy.enabled=false must grant nothing on networkpolicies"
grep -qF -- '--network-policy=false' <<<"$nonp" || fail "networkPolicy.enabled=false not passed to the operator"
# Checkpoint claims: the operator is told the defaults, and gets RBAC for them only when enabled.
for a in --checkpoint-volumes=true --checkpoint-storage-size=1Gi --checkpoint-access-mode=ReadWriteOnce; do
  grep -qF -- "$a" <<<"$out" || fail "no $a in the operator's arguments"
done
# No class: the flag is left out (the cluster's default class), not passed empty.
grep -qF -- '--checkpoint-storage-class' <<<"$out" && fail "--checkpoint-storage-class passed without a class"
grep -q 'persistentvolumeclaims' <<<"$out" || fail "checkpointStorage.enabled grants nothing on persistentvolumeclaims"
rwx="$("$HELM" template --kube-version "$KUBE_VERSION" "$REL" "$CHART" -n "$NS" --set checkpointStorage.accessMode=ReadWriteMany \
  --set checkpointStorage.size=20Gi --set checkpointStorage.storageClassName=nfs)"
grep -qF -- '--checkpoint-access-mode=ReadWriteMany' <<<"$rwx" && grep -qF -- '--checkpoint-storage-size=20Gi' <<<"$rwx" &&
  grep -qF -- '--checkpoint-storage-class=nfs' <<<"$rwx" || fail "checkpointStorage values not passed to the operator"
"$HELM" template --kube-version "$KUBE_VERSION" "$REL" "$CHART" -n "$NS" --set checkpointStorage.accessMode=ReadOnlyMany >/dev/null 2>&1 &&
  fail "checkpointStorage.accessMode=ReadOnlyMany accepted by the values schema"
nopvc="$("$HELM" template --kube-version "$KUBE_VERSION" "$REL" "$CHART" -n "$NS" --set checkpointStorage.enabled=false)"
grep -q 'persistentvolumeclaims' <<<"$nopvc" && fail "checkpointStorage.enabled=false must grant nothing on persistentvolumeclaims"
grep -qF -- '--checkpoint-volumes=false' <<<"$nopvc" || fail "checkpointStorage.enabled=false not passed to the operator"
# The worker image follows the operator's tag (one build, one version), never
# :latest (a pull on every pod start, and none possible on a registry-less node).
APP_VERSION="$(awk '$1 == "appVersion:" { gsub(/"/, "", $2); print $2 }' "$CHART/Chart.yaml")"
grep -qF -- "--worker-image=localhost/distrain/worker:$APP_VERSION" <<<"$out" ||
  fail "the default worker image is not localhost/distrain/worker:$APP_VERSION: $(grep -F -- --worker-image <<<"$out")"
wi="$("$HELM" template --kube-version "$KUBE_VERSION" "$REL" "$CHART" -n "$NS" --set image.tag=v2 --set operator.clusterDomain=cluster.local)"
grep -qF -- "--worker-image=localhost/distrain/worker:v2" <<<"$wi" && grep -qF -- "--cluster-domain=cluster.local" <<<"$wi" ||
  fail "image.tag / operator.clusterDomain not passed as --worker-image / --cluster-domain"
wi="$("$HELM" template --kube-version "$KUBE_VERSION" "$REL" "$CHART" -n "$NS" --set workerImage.repository=reg/w --set workerImage.tag=t)"
grep -qF -- "--worker-image=reg/w:t" <<<"$wi" || fail "workerImage.repository/tag not passed as --worker-image"
grep -qF -- "--worker-cuda-image=localhost/distrain/worker-cuda:$APP_VERSION" <<<"$out" ||
  fail "the default worker CUDA image is not localhost/distrain/worker-cuda:$APP_VERSION: $(grep -F -- --worker-cuda-image <<<"$out")"
wi="$("$HELM" template --kube-version "$KUBE_VERSION" "$REL" "$CHART" -n "$NS" --set workerCudaImage.repository=reg/wc --set workerCudaImage.tag=t2)"
grep -qF -- "--worker-cuda-image=reg/wc:t2" <<<"$wi" || fail "workerCudaImage.repository/tag not passed as --worker-cuda-image"
grep -qF -- "--cluster-domain" <<<"$out" && fail "--cluster-domain passed without operator.clusterDomain"
pass "replicas > 1 get a PodDisruptionBudget and anti-affinity; NetworkPolicy and checkpoint-claim flags and RBAC follow their values; the worker image and cluster domain reach the operator"

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
# can_i_table TITLE: reads rows "yes|no VERB RESOURCE [kubectl flags]" from
# stdin, asks the real API server (kubectl auth can-i --as the
# ServiceAccount), prints the table, and fails naming how many rows differ
# from the wanted answer (marked in the table).
can_i_table() {
  local title="$1" want args got bad=0 rows=0
  printf '[helm-test]   can-i table (%s), as %s\n' "$title" "$SA"
  printf '[helm-test]     %-5s %-5s %s\n' want got "kubectl auth can-i ..."
  while read -r want args; do
    [ -z "$want" ] && continue
    # shellcheck disable=SC2086
    got="$("$KUBECTL" auth can-i --as="$SA" $args 2>/dev/null)"
    rows=$((rows + 1))
    printf '[helm-test]     %-5s %-5s %s%s\n' "$want" "$got" "$args" "$([ "$got" = "$want" ] || echo '   <-- WRONG')"
    [ "$got" = "$want" ] || bad=$((bad + 1))
  done
  [ "$bad" = 0 ] || fail "$bad of $rows can-i answers differ from the chart's intent ($title)"
  CAN_I_ROWS=$rows
}
OTHER_NS=kube-system  # any namespace: cluster-wide RBAC reaches all of them
can_i_table "cluster-wide install" <<ROWS
yes get pods -n default
yes list pods -n default
yes watch pods -n $OTHER_NS
yes create pods -n default
yes delete pods -n default
yes patch pods -n default
yes create services -n default
yes delete services -n default
yes list distributedtrainingjobs.distrain.io -n default
yes watch distributedtrainingjobs.distrain.io -n $OTHER_NS
yes delete distributedtrainingjobs.distrain.io -n default
yes update distributedtrainingjobs.distrain.io --subresource=status -n default
yes patch distributedtrainingjobs.distrain.io --subresource=status -n default
yes update distributedtrainingjobs.distrain.io --subresource=finalizers -n default
yes watch configmaps -n default
yes create configmaps -n default
yes update configmaps -n default
yes list networkpolicies.networking.k8s.io -n default
yes watch networkpolicies.networking.k8s.io -n default
yes create networkpolicies.networking.k8s.io -n default
yes update networkpolicies.networking.k8s.io -n default
yes list persistentvolumeclaims -n default
yes watch persistentvolumeclaims -n $OTHER_NS
yes create persistentvolumeclaims -n default
yes create events.events.k8s.io -n default
yes patch events.events.k8s.io -n default
yes get customresourcedefinitions.apiextensions.k8s.io/podgroups.scheduling.x-k8s.io
yes create leases.coordination.k8s.io -n $NS
yes update leases.coordination.k8s.io -n $NS
yes get secrets -n default
yes create secrets -n default
yes update secrets -n $OTHER_NS
no list secrets -n default
no watch secrets -n $OTHER_NS
no delete secrets -n default
no patch secrets -n default
no create deployments.apps -n default
no create distributedtrainingjobs.distrain.io -n default
no update distributedtrainingjobs.distrain.io -n default
no patch distributedtrainingjobs.distrain.io -n default
no update pods -n default
no create pods --subresource=exec -n default
no create pods --subresource=attach -n default
no create pods --subresource=portforward -n default
no create pods --subresource=eviction -n default
no delete configmaps -n default
no patch configmaps -n default
no delete networkpolicies.networking.k8s.io -n default
no patch networkpolicies.networking.k8s.io -n default
no delete persistentvolumeclaims -n default
no update persistentvolumeclaims -n default
no create persistentvolumes
no create serviceaccounts --subresource=token -n default
no update serviceaccounts -n default
no create rolebindings.rbac.authorization.k8s.io -n default
no create clusterroles.rbac.authorization.k8s.io
no bind clusterroles.rbac.authorization.k8s.io
no escalate roles.rbac.authorization.k8s.io -n default
no impersonate users
no get nodes
no list namespaces
no list customresourcedefinitions.apiextensions.k8s.io
no get customresourcedefinitions.apiextensions.k8s.io/distributedtrainingjobs.distrain.io
no create leases.coordination.k8s.io -n default
ROWS
pass "the operator's ServiceAccount can do what reconciling needs and nothing more ($CAN_I_ROWS can-i answers; podgroups need their CRD to resolve)"

# watchNamespaces: a second release whose operator watches one namespace gets
# its rules there only.
REL2=dtns
NS_WATCHED="distrain-helm-watched-$$"
"$KUBECTL" create namespace "$NS_WATCHED" >/dev/null
"$HELM" install "$REL2" "$CHART" -n "$NS" --set "operator.watchNamespaces={$NS_WATCHED}" --set rbac.aggregateToDefaultRoles=false \
  --set replicaCount=1 >/tmp/helm-install2.$$ 2>&1 || { cat /tmp/helm-install2.$$; fail "helm install with watchNamespaces"; }
SA="system:serviceaccount:$NS:$REL2-distrain"
can_i_table "watchNamespaces={$NS_WATCHED}" <<ROWS
yes create pods -n $NS_WATCHED
yes patch pods -n $NS_WATCHED
no patch pods -n default
yes watch distributedtrainingjobs.distrain.io -n $NS_WATCHED
yes create networkpolicies.networking.k8s.io -n $NS_WATCHED
yes update configmaps -n $NS_WATCHED
yes create persistentvolumeclaims -n $NS_WATCHED
yes get customresourcedefinitions.apiextensions.k8s.io/podgroups.scheduling.x-k8s.io
yes update leases.coordination.k8s.io -n $NS
no create pods -n default
no list pods -A
no watch distributedtrainingjobs.distrain.io -A
no watch distributedtrainingjobs.distrain.io -n default
no create networkpolicies.networking.k8s.io -n default
no update configmaps -n default
no create persistentvolumeclaims -n default
no create services -n $OTHER_NS
yes create secrets -n $NS_WATCHED
no get secrets -n default
no list secrets -n $NS_WATCHED
no list customresourcedefinitions.apiextensions.k8s.io
ROWS
"$HELM" uninstall "$REL2" -n "$NS" --wait >/dev/null 2>&1 || fail "helm uninstall $REL2"
pass "with watchNamespaces the operator's rules hold in the watched namespace only ($CAN_I_ROWS can-i answers)"

# 5. dashboard
"$KUBECTL" -n "$NS" get configmap "$REL-distrain-dashboard" -o jsonpath='{.data.distrain\.json}' >/tmp/helm-dash.$$.json
python3 - /tmp/helm-dash.$$.json <<'PY' || fail "dashboard check (above)"
import json, re, sys
d = json.load(open(sys.argv[1]))
exprs = [t["expr"] for p in d["panels"] for t in p.get("targets", [])]
names = set(re.findall(r"\b((?:distrain|controller_runtime|workqueue|rest_client|leader_election)_[a-z_]+)", " ".join(exprs)))
worker = {"distrain_steps_total", "distrain_examples_total", "distrain_loss", "distrain_step_duration_seconds_bucket",
          "distrain_collective_bytes_total", "distrain_ps_rpc_seconds_bucket",
          "distrain_device_copy_gigabytes_per_second", "distrain_auto_strategy_info"}
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
