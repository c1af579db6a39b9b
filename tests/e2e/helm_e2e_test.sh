#!/usr/bin/env bash
# e2e: the operator installed by the Helm chart, as a user installs it, runs as
# a pod on the test node (tests/e2e/node_agent.cc) and trains a job.
#   tests/kube/with_control_plane.sh bash tests/e2e/helm_e2e_test.sh BUILD_DIR
#
# Checks, each printed as it passes:
#   0. the node agent builds a pod's process as a kubelet would (a shell pod):
#      dependent env expansion, Secret decoding, a late ConfigMap waited for,
#      volumes private to the process and read-only where they must be;
#   1. `helm install charts/distrain` (leader election, watching this test's
#      namespace): the operator pod runs and holds the Lease;
#   2. it authenticates in-cluster as system:serviceaccount:<ns>:<release>-distrain:
#      the process's environment has KUBERNETES_SERVICE_HOST and no KUBECONFIG,
#      it logs the in-cluster API address, and the token it sees at
#      /var/run/secrets/kubernetes.io/serviceaccount (its own mount namespace)
#      is that ServiceAccount's, bound to its pod (`kubectl auth whoami`); the
#      agent refreshes that token (--token-refresh-seconds) and the operator
#      keeps working on the fresh one;
#   3. the OneDevice example (shortened) reaches Succeeded, its pods made by
#      the in-cluster operator under the chart's RBAC only;
#   4. the hook pod passes Pod Security "restricted"; `helm test` passes: it runs `distrain-operator check` against
#      the operator's Service (/readyz, leader_election_master_status 1, the
#      CRD served);
#   5. the Deployment scaled to 0: `helm test` fails; scaled back: it passes;
#   6. `helm uninstall` leaves no object of the release.
# Needs root (the agent manages /etc/hosts and mounts volumes) and nsenter;
# skips (exit 77) without root.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BUILD="$(cd "${1:?usage: helm_e2e_test.sh BUILD_DIR}" && pwd)"
: "${KUBECONFIG:?run through tests/kube/with_control_plane.sh}"
KUBECTL="${DISTRAIN_KUBE_BINDIR:?}/kubectl"
CP="${DISTRAIN_CONTROL_PLANE:-$ROOT/scripts/control-plane.sh}"
WAIT_S="${E2E_WAIT_S:-180}"


# shellcheck source=tests/e2e/e2e_lib.sh
. "$ROOT/tests/e2e/e2e_lib.sh"
e2e_preflight
HELM="$("$CP" helmbin 2>/dev/null)" || { echo "FAIL: no helm (scripts/control-plane.sh build builds it)"; exit 1; }
NS="e2e-helm-$$"
REL="dt$$"  # cluster-scoped objects are named after it: unique on a shared control plane
SA="$REL-distrain"
DEPLOY="$REL-distrain-operator"
WORK="$(mktemp -d /tmp/distrain-e2e-helm.XXXXXX)"
k() { "$KUBECTL" -n "$NS" "$@"; }
ok() { echo "ok: $*"; }
dump() {
  echo "--- kubectl get pods,dtj -o wide"
  k get pods,dtj -o wide 2>&1
  local f
  for f in "$WORK"/logs/"${NS}"_*.log "$WORK/agent.log"; do
    [ -f "$f" ] || continue
    echo "--- $(basename "$f") (last 20 lines)"
    tail -n 20 "$f"
  done
}
FAILED=0
fail() {
  echo "FAIL: $*"
  FAILED=1
  dump
  exit 1
}
cleanup() {
  "$HELM" uninstall "$REL" -n "$NS" >/dev/null 2>&1
  "$KUBECTL" delete namespace "$NS" "$NS-restricted" --wait=false >/dev/null 2>&1
  e2e_stop
  if [ "$FAILED" != 0 ] || [ -n "${E2E_KEEP:-}" ]; then
    echo "--- logs kept in $WORK (agent.log, logs/, pods/)"
  else
    rm -rf "$WORK"
  fi
}
trap cleanup EXIT

start=$SECONDS
"$KUBECTL" create namespace "$NS" >/dev/null || fail "cannot create namespace $NS"
# Tokens refreshed every 5 s instead of after 80% of an hour: the run sees one.
E2E_NODE_ARGS=(--token-refresh-seconds 5)
e2e_start_node "$WORK" "$NS" || exit 1

# 0. The agent builds a pod's process as a kubelet would (a shell pod: an
# absolute command that exists here runs as is): dependent env expansion,
# Secret values decoded, a ConfigMap that appears late, volumes mounted for
# the process only (read-only where they must be), the pod's hostname.
k create secret generic fidelity --from-literal=password='s3cret!' >/dev/null || fail "create secret"
cat >"$WORK/fidelity.yaml" <<'YAML'
apiVersion: v1
kind: Pod
metadata: {name: fidelity}
spec:
  restartPolicy: Never
  containers:
    - name: main
      image: localhost/distrain/worker:test
      command: [/bin/sh, -c]
      args:
        - |
          echo "tf=$TF_CONFIG"; echo "pw=$PASSWORD"; echo "lit=$LITERAL"; echo 'arg=$(CLUSTER)'
          echo "host=$(hostname) api=$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT"
          echo "cfg=$(cat /run/distrain-fidelity/cfg/cluster) ns=$(cat /run/distrain-fidelity/podinfo/namespace)"
          touch /run/distrain-fidelity/cfg/x 2>/dev/null && echo "cfg writable" || echo "cfg read-only"
          touch /run/distrain-fidelity/scratch/x && echo "scratch writable"
      env:
        - name: CLUSTER
          valueFrom: {configMapKeyRef: {name: fidelity-late, key: cluster}}
        - name: TF_CONFIG
          value: '{"cluster":$(CLUSTER),"task":{"index":0}}'
        - name: LITERAL
          value: '$$(CLUSTER) $(UNDEFINED)'
        - name: PASSWORD
          valueFrom: {secretKeyRef: {name: fidelity, key: password}}
      volumeMounts:
        - {name: cfg, mountPath: /run/distrain-fidelity/cfg}
        - {name: scratch, mountPath: /run/distrain-fidelity/scratch}
        - {name: podinfo, mountPath: /run/distrain-fidelity/podinfo}
  volumes:
    - {name: cfg, configMap: {name: fidelity-late}}
    - {name: scratch, emptyDir: {}}
    - name: podinfo
      projected: {sources: [{downwardAPI: {items: [{path: namespace, fieldRef: {fieldPath: metadata.namespace}}]}}]}
YAML
k apply -f "$WORK/fidelity.yaml" >/dev/null || fail "apply the fidelity pod"
sleep 1.5
reason="$(k get pod fidelity -o jsonpath='{.status.containerStatuses[0].state.waiting.reason}')"
[ "$reason" = CreateContainerConfigError ] || fail "the pod whose ConfigMap is missing is not waiting (reason '$reason')"
k create configmap fidelity-late --from-literal=cluster='{"worker":["w-0:2222"]}' >/dev/null || fail "create configmap"
k wait --for=jsonpath='{.status.phase}'=Succeeded pod/fidelity --timeout=30s >/dev/null || fail "the fidelity pod did not succeed"
flog="$WORK/logs/${NS}_fidelity.log"
for want in 'tf={"cluster":{"worker":["w-0:2222"]},"task":{"index":0}}' 'pw=s3cret!' 'lit=$(CLUSTER) $(UNDEFINED)' \
  'arg={"worker":["w-0:2222"]}' "host=fidelity api=127.0.0.1:" 'cfg={"worker":["w-0:2222"]} ns='"$NS" \
  "cfg read-only" "scratch writable"; do
  grep -qF -- "$want" "$flog" || { cat "$flog"; fail "the fidelity pod's output lacks: $want"; }
done
# The mount points are made on the host (empty); what is mounted on them is not.
[ -z "$(find /run/distrain-fidelity -type f 2>/dev/null)" ] || fail "the pod's volumes leaked into the host's /run/distrain-fidelity"
rm -rf /run/distrain-fidelity
ok "kubelet fidelity: \$(VAR) expansion, Secret decoded, late ConfigMap waited for, volumes private and read-only, hostname"

# 1. install; the pod runs and leads. One replica: a standby is ready too (it
# must stay in the Service), and with no kube-proxy the Service name resolves
# to one fixed ready pod, so with two `helm test` might only ever reach the
# standby (leader_election_master_status 0); a real Service spreads the
# check's retries over both.
# tests.wait=5s: the failing `helm test` below gives up after 5 s, not 20.
e2e_helm_install "$REL" "$NS" --set replicaCount=1 --set tests.wait=5s >"$WORK/install.log" 2>&1 ||
  { cat "$WORK/install.log"; fail "helm install"; }
leader="$(e2e_wait_leader "$DEPLOY" "$NS" 60)" || fail "no operator pod took the Lease $NS/$DEPLOY within 60 s"
running="$(k get pods -l app.kubernetes.io/component=operator,app.kubernetes.io/instance=$REL \
  -o jsonpath='{range .items[?(@.status.phase=="Running")]}{.metadata.name} {end}')"
[ "$running" = "$leader " ] || fail "want the leader $leader Running, got: $running"
ok "helm install: the operator pod $leader is Running and holds the Lease"

# 2. in-cluster identity, from the process's own view.
pid="$(cat "$WORK/pids/${NS}_$leader.pid")"
env_of() { tr '\0' '\n' <"/proc/$pid/environ"; }
env_of | grep -q '^KUBERNETES_SERVICE_HOST=' || fail "the operator's environment lacks KUBERNETES_SERVICE_HOST"
env_of | grep -q '^KUBECONFIG=' && fail "the operator's environment has KUBECONFIG: it must use the in-cluster config"
[ "$(readlink "/proc/$pid/ns/mnt")" != "$(readlink /proc/self/ns/mnt)" ] ||
  fail "the operator does not run in a mount namespace of its own"
api="https://$(env_of | sed -n 's/^KUBERNETES_SERVICE_HOST=//p'):$(env_of | sed -n 's/^KUBERNETES_SERVICE_PORT=//p')"
grep -q "against $api" "$WORK/logs/${NS}_$leader.log" ||
  fail "the operator's log does not say it talks to the in-cluster address $api"
sa_dir=/var/run/secrets/kubernetes.io/serviceaccount
in_pod() { nsenter -t "$pid" -m "$@"; }  # the operator's mount namespace
for f in token ca.crt namespace; do in_pod test -s "$sa_dir/$f" || fail "the operator does not see $sa_dir/$f"; done
[ "$(in_pod cat "$sa_dir/namespace")" = "$NS" ] || fail "the mounted namespace file says '$(in_pod cat "$sa_dir/namespace")'"
[ -e "$sa_dir/token" ] && fail "the ServiceAccount token leaked into the host's mount namespace"
in_pod cat "$sa_dir/ca.crt" >"$WORK/ca.crt"
whoami() {
  "$KUBECTL" --kubeconfig=/dev/null --server="$api" --certificate-authority="$WORK/ca.crt" --token="$1" \
    auth whoami -o jsonpath='{.status.userInfo.username} {.status.userInfo.extra.authentication\.kubernetes\.io/pod-name}'
}
token1="$(in_pod cat "$sa_dir/token")"
who="$(whoami "$token1" 2>&1)"
[ "$who" = "system:serviceaccount:$NS:$SA [\"$leader\"]" ] || [ "$who" = "system:serviceaccount:$NS:$SA $leader" ] ||
  fail "the operator's token authenticates as '$who', want system:serviceaccount:$NS:$SA bound to pod $leader"
ok "the operator authenticates in-cluster ($api) as system:serviceaccount:$NS:$SA, its token bound to pod $leader"
for i in $(seq 1 50); do
  [ "$(in_pod cat "$sa_dir/token")" != "$token1" ] && break
  sleep 0.2
done
[ "$(in_pod cat "$sa_dir/token")" != "$token1" ] || fail "the agent did not refresh the projected token within 10 s"
ok "the projected token was refreshed in place"

# 3. a job trains through the chart's operator.
e2e_example "$ROOT/examples/onedevice.yaml" 150 >"$WORK/onedevice.yaml"
k apply -f "$WORK/onedevice.yaml" >/dev/null || fail "kubectl apply examples/onedevice.yaml"
k wait --for=condition=Succeeded dtj/onedevice --timeout="${WAIT_S}s" >/dev/null ||
  fail "onedevice did not reach Succeeded within ${WAIT_S}s"
k logs onedevice-worker-0 2>&1 | grep -Eq "training complete: .*accuracy [0-9.]+" ||
  fail "no final accuracy line in 'kubectl logs onedevice-worker-0'"
# The chart's operator did it: the job's events name the leader pod as their
# reportingInstance ($POD_NAME).
reporters="$(k get events.events.k8s.io -o jsonpath='{range .items[?(@.regarding.name=="onedevice")]}{.reportingInstance}{" "}{end}')"
grep -qw -- "$leader" <<<"$reporters" || fail "the events of onedevice come from '$reporters', not the chart's operator $leader"
ok "examples/onedevice.yaml Succeeded through the in-cluster operator"

# 4. The hook pod passes Pod Security "restricted" (server-side dry run in a
# namespace that enforces it), like the Deployment's.
NS_R="$NS-restricted"
"$KUBECTL" create namespace "$NS_R" >/dev/null && "$KUBECTL" label namespace "$NS_R" \
  pod-security.kubernetes.io/enforce=restricted pod-security.kubernetes.io/warn=restricted >/dev/null ||
  fail "cannot create the restricted namespace $NS_R"
# (helm template has no cluster to ask; render for the control plane's version)
"$HELM" template --kube-version "$(awk -F= '/^K8S_VERSION=/ {print $2; exit}' "$CP")" \
  "$REL" "$ROOT/charts/distrain" -n "$NS_R" --show-only templates/tests/operator-check.yaml |
  "$KUBECTL" apply -n "$NS_R" --dry-run=server -f - >"$WORK/psa.log" 2>&1 || { cat "$WORK/psa.log"; fail "server-side dry run of the helm test pod"; }
grep -qi "violate PodSecurity" "$WORK/psa.log" && { cat "$WORK/psa.log"; fail "the helm test pod violates Pod Security restricted"; }
ok "the helm test pod passes Pod Security 'restricted'"

# helm test passes. (No --logs: a passing hook pod is deleted at once, so
# its log is read from the node.)
TEST_LOG="$WORK/logs/${NS}_$REL-distrain-test-operator.log"
"$HELM" test "$REL" -n "$NS" >"$WORK/test1.out" 2>&1 || { cat "$WORK/test1.out" "$TEST_LOG"; fail "helm test"; }
grep -q "Phase: *Succeeded" "$WORK/test1.out" || { cat "$WORK/test1.out"; fail "helm test did not report the hook Succeeded"; }
grep -q "the operator works" "$TEST_LOG" || { cat "$TEST_LOG"; fail "the hook's log lacks the check's verdict"; }
grep -q "leader_election_master_status 1" "$TEST_LOG" || { cat "$TEST_LOG"; fail "the hook did not check the leader"; }
ok "helm test passes: $(grep -c '^ok: ' "$TEST_LOG") checks of the operator Service"

# 5. no operator -> helm test fails; back -> it passes.
k scale deployment "$DEPLOY" --replicas=0 >/dev/null || fail "kubectl scale --replicas=0"
k wait --for=delete pod -l app.kubernetes.io/component=operator,app.kubernetes.io/instance=$REL --timeout=60s >/dev/null 2>&1 ||
  fail "the operator pods did not go away after scaling to 0"
if "$HELM" test "$REL" -n "$NS" >"$WORK/test2.out" 2>&1; then
  cat "$WORK/test2.out" "$TEST_LOG"
  fail "helm test passed with the operator scaled to 0"
fi
k logs "$REL-distrain-test-operator" >"$WORK/test2.log" 2>&1  # a failed hook pod stays for this
grep -q "FAIL: " "$WORK/test2.log" || { cat "$WORK/test2.out" "$WORK/test2.log"; fail "the failing hook's log does not say why"; }
ok "helm test fails with no operator: $(grep -m1 'FAIL: ' "$WORK/test2.log" | cut -c1-160)"
k scale deployment "$DEPLOY" --replicas=1 >/dev/null || fail "kubectl scale --replicas=1"
e2e_wait_leader "$DEPLOY" "$NS" 60 >/dev/null || fail "no operator took the Lease after scaling back"
"$HELM" test "$REL" -n "$NS" >"$WORK/test3.out" 2>&1 || { cat "$WORK/test3.out" "$TEST_LOG"; fail "helm test after scaling back"; }
ok "helm test passes again once an operator is back"

# 6. uninstall leaves nothing of the release (the Lease is the operator's own,
# not the chart's; it goes with the namespace).
# helm's --wait covers the objects it created, not the operator pod: the
# garbage collector deletes that after its ReplicaSet, and the node agent then
# stops the process and removes the pod. Poll for that cascade with a deadline.
"$HELM" uninstall "$REL" -n "$NS" --wait >/dev/null 2>&1 || fail "helm uninstall"
deadline=$((SECONDS + 60))
while :; do
  left="$("$KUBECTL" get all,serviceaccounts,roles,rolebindings,configmaps,clusterroles,clusterrolebindings -A \
    -l "app.kubernetes.io/instance=$REL" -o name 2>&1)"
  [ -z "$left" ] || [ "$SECONDS" -ge "$deadline" ] && break
  sleep 1
done
[ -z "$left" ] || fail "helm uninstall left (after 60 s): $left"
ok "helm uninstall leaves no object of the release"

echo "e2e helm: all checks passed in $((SECONDS - start)) s"
