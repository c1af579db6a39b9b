#!/usr/bin/env bash
# e2e: Kueue admits a DistributedTrainingJob whole or not at all.
#   tests/e2e/with_node.sh bash tests/e2e/kueue_test.sh BUILD_DIR
# Kueue (scripts/kueue.sh: built from its pinned Go module, its pod integration's
# webhooks served by a local process) runs against the real node's control plane
# (scripts/node.sh), whose kube-scheduler binds only admitted pods and whose kubelet
# runs them from the worker image. A ClusterQueue has quota for one job (1500m CPU;
# each job is two 500m workers) and two MultiWorkerMirrored jobs are applied to its
# LocalQueue, the second right after the first:
#   - the first job's pods are one Kueue pod group (its Workload <job>-<uid>, two
#     pods) and run to Succeeded;
#   - while it has not finished, every pod of the second carries Kueue's admission
#     scheduling gate and none runs, though one of its pods alone would fit in the
#     quota left (so pods admitted one by one would show here), and `kubectl get dtj`
#     shows it Queued (-o wide: the reason, WaitingForKueueAdmission);
#   - once the first finishes (Kueue releases its quota), the second runs to
#     Succeeded, its condition Queued False (KueueAdmitted), and neither Workload
#     holds quota at the end.
# Needs root (the node; Kueue runs in a mount namespace); skips
# (exit 77) otherwise. Reuses a running Kueue (scripts/kueue.sh status) or starts one
# and stops it again at exit.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BUILD="$(cd "${1:?usage: kueue_test.sh BUILD_DIR}" && pwd)"
: "${KUBECONFIG:?run through tests/e2e/with_node.sh}"
KUBECTL="${DISTRAIN_KUBE_BINDIR:?}/kubectl"
WAIT_S="${E2E_WAIT_S:-300}"
KUEUE="$ROOT/scripts/kueue.sh"

# shellcheck source=tests/e2e/e2e_lib.sh
. "$ROOT/tests/e2e/e2e_lib.sh"
e2e_preflight
NS="e2e-kueue-$$"
CQ="e2e-kueue-$$"
FLAVOR="e2e-kueue-$$"
WORK="$(mktemp -d /tmp/distrain-e2e-kueue.XXXXXX)"

started_kueue=0
cleanup() {
  "$KUBECTL" delete namespace "$NS" --wait=false >/dev/null 2>&1
  "$KUBECTL" delete clusterqueue "$CQ" --wait=false >/dev/null 2>&1
  "$KUBECTL" delete resourceflavor "$FLAVOR" --wait=false >/dev/null 2>&1
  e2e_stop
  [ "$started_kueue" = 1 ] && "$KUEUE" down >/dev/null 2>&1
  if [ "$failures" != 0 ] || [ -n "${E2E_KEEP:-}" ]; then
    echo "--- logs kept in $WORK (operator.log); the node's in ${DISTRAIN_NODE_DIR:-/tmp/distrain-node}/logs"
  else
    rm -rf "$WORK"
  fi
}
trap cleanup EXIT

start=$SECONDS
if ! "$KUEUE" status >/dev/null 2>&1; then
  "$KUEUE" up || { echo "FAIL: scripts/kueue.sh up failed"; exit 1; }
  started_kueue=1
fi
echo "Kueue ready after $((SECONDS - start)) s"

"$KUBECTL" create namespace "$NS" >/dev/null || { echo "FAIL: cannot create namespace $NS"; exit 1; }
"$KUBECTL" label namespace "$NS" distrain.io/kueue=enabled pod-security.kubernetes.io/enforce=restricted \
  pod-security.kubernetes.io/enforce-version=latest >/dev/null ||
  { echo "FAIL: cannot label namespace $NS"; exit 1; }
"$KUBECTL" apply -f - >/dev/null <<EOF || { echo "FAIL: cannot create the Kueue queues"; exit 1; }
apiVersion: kueue.x-k8s.io/v1beta2
kind: ResourceFlavor
metadata:
  name: $FLAVOR
---
apiVersion: kueue.x-k8s.io/v1beta2
kind: ClusterQueue
metadata:
  name: $CQ
spec:
  namespaceSelector: {}
  resourceGroups:
  - coveredResources: ["cpu"]
    flavors:
    - name: $FLAVOR
      resources:
      - name: cpu
        nominalQuota: 1500m
---
apiVersion: kueue.x-k8s.io/v1beta2
kind: LocalQueue
metadata:
  name: training
  namespace: $NS
spec:
  clusterQueue: $CQ
EOF
e2e_load_images || { echo "FAIL: loading the images into the node (scripts/node.sh load-images)"; exit 1; }
e2e_start_operator "$WORK/operator.log" "$NS"

# job NAME STEPS: a MultiWorkerMirrored job of two 500m workers in LocalQueue training.
job() {
  cat <<EOF
apiVersion: distrain.io/v1alpha1
kind: DistributedTrainingJob
metadata:
  name: $1
spec:
  strategy: MultiWorkerMirrored
  runPolicy:
    scheduling:
      queue: training
  replicaSpecs:
    Worker:
      replicas: 2
      template:
        spec:
          containers:
          - name: distrain
            resources:
              requests:
                cpu: 500m
  training:
    model:
      hiddenUnits: [64]
    dataset: {type: synthetic, numExamples: 4000, numEvalExamples: 500, numFeatures: 784,
              numClasses: 10, autoShardPolicy: DATA}
    optimizer: {type: adam, learningRate: 0.001}
    checkpoint:
      volume: {emptyDir: {}}
    globalBatchSize: 64
    steps: $2
    logEverySteps: 100
EOF
}

dump() {
  echo "--- kubectl get dtj,pods,workloads"
  k get dtj -o wide 2>&1
  k get pods -o wide 2>&1
  k get workloads -o wide 2>&1
  k get dtj "$1" -o yaml 2>&1 | sed -n '/^status:/,$p'
  echo "--- kueue log (last 20 lines)"
  tail -n 20 "${DISTRAIN_KUBE_DIR:-/tmp/distrain-kube}/kueue/logs/kueue.log" 2>&1
}

gates() { k get pod "$1" -o jsonpath='{.spec.schedulingGates[*].name}' 2>/dev/null; }

job first 5000 >"$WORK/first.yaml"
job second 300 >"$WORK/second.yaml"
k apply -f "$WORK/first.yaml" >/dev/null || { echo "FAIL: kubectl apply first"; exit 1; }
k apply -f "$WORK/second.yaml" >/dev/null || { echo "FAIL: kubectl apply second"; exit 1; }

# The first job's pods carry the pod-group metadata and Kueue admits them (no gate left).
first_group=""
for i in $(seq 1 300); do
  first_group="$(k get pod first-worker-0 -o jsonpath='{.metadata.labels.kueue\.x-k8s\.io/pod-group-name}' 2>/dev/null)"
  if [ -n "$first_group" ] && [ -z "$(gates first-worker-0)" ] && [ -z "$(gates first-worker-1)" ] &&
    k get pod first-worker-1 >/dev/null 2>&1; then break; fi
  sleep 0.2
done
uid="$(k get dtj first -o jsonpath='{.metadata.uid}')"
[ "$first_group" = "first-$(tr -d - <<<"$uid" | cut -c1-8)" ] ||
  fail "first: pod-group-name label is '$first_group' (want first-<8 hex digits of its uid>)"
if [ -n "$(gates first-worker-0)$(gates first-worker-1)" ]; then
  fail "first: Kueue did not admit it within 60 s (gates: $(gates first-worker-0) / $(gates first-worker-1))"
  dump first
  exit 1
fi
total="$(k get pod first-worker-1 -o jsonpath='{.metadata.annotations.kueue\.x-k8s\.io/pod-group-total-count}')"
[ "$total" = 2 ] || fail "first: pod-group-total-count is '$total' (want 2)"
wl="$(k get workload "$first_group" -o jsonpath='{.spec.podSets[*].name}={.spec.podSets[*].count} {.status.admission.clusterQueue}' 2>&1)"
[ "$wl" = "worker=2 $CQ" ] || fail "first: Workload $first_group is '$wl' (want one pod set worker=2, admitted to $CQ)"

# Until the first job finishes, the second waits whole: every pod gated, none bound or running.
saw_queued=0
seen_second=0
while true; do
  state="$(k get dtj first -o jsonpath='{.status.state}' 2>/dev/null)"
  [ "$state" = Succeeded ] || [ "$state" = Failed ] && break
  for p in second-worker-0 second-worker-1; do
    info="$(k get pod "$p" -o jsonpath='{.spec.schedulingGates[*].name}|{.spec.nodeName}|{.status.phase}' 2>/dev/null)" || continue
    [ -n "$info" ] || continue
    seen_second=1
    case "$info" in
      *kueue.x-k8s.io/admission*"||Pending") ;;
      *) fail "second: pod $p is '$info' (gates|node|phase) while first is still $state"; dump second; exit 1 ;;
    esac
  done
  row="$(k get dtj second --no-headers 2>/dev/null)"
  if [ "$saw_queued" = 0 ] && grep -Eq "^second +MultiWorkerMirrored +Queued " <<<"$row"; then
    saw_queued=1
    echo "while first runs: kubectl get dtj second: $row"
    reason="$(k get dtj second -o jsonpath='{.status.conditions[?(@.type=="Queued")].reason}: {.status.conditions[?(@.type=="Queued")].message}')"
    echo "  Queued: $reason"
    grep -q "^WaitingForKueueAdmission: 2 of 2 pods wait for Kueue to admit pod group second-" <<<"$reason" ||
      fail "second: Queued condition is '$reason'"
    wide="$(k get dtj second -o wide 2>&1)"
    echo "$wide" | sed 's/^/  /'
    grep -Eq "^NAME +STRATEGY +STATE +WORKERS +STEP +AGE +QUEUE" <<<"$wide" &&
      grep -Eq "^second +.* WaitingForKueueAdmission$" <<<"$wide" ||
      fail "second: 'kubectl get dtj -o wide' does not show why it waits: $wide"
  fi
  [ $((SECONDS - start)) -lt "$WAIT_S" ] || { fail "first: not finished within ${WAIT_S}s"; dump first; exit 1; }
  sleep 0.3
done
[ "$state" = Succeeded ] || { fail "first: ended $state"; dump first; }
[ "$seen_second" = 1 ] || fail "second: its pods never appeared while first ran"
[ "$saw_queued" = 1 ] || fail "second: 'kubectl get dtj' never showed it Queued while first ran: $(k get dtj 2>&1)"

# Then the second is admitted and succeeds.
if ! k wait --for=condition=Succeeded dtj/second --timeout="${WAIT_S}s" >/dev/null; then
  fail "second: did not reach Succeeded within ${WAIT_S}s after first finished"
  dump second
  exit 1
fi
queued="$(k get dtj second -o jsonpath='{.status.conditions[?(@.type=="Queued")].status} {.status.conditions[?(@.type=="Queued")].reason}')"
# Finished: Queued was cleared when it was admitted, and again (JobFinished) at the end.
[ "$queued" = "False JobFinished" ] || fail "second: Queued is '$queued' at the end (want False JobFinished)"
k get events --field-selector involvedObject.name=second -o jsonpath='{.items[*].reason}' 2>/dev/null |
  grep -q KueueAdmitted || fail "second: no KueueAdmitted event"

# Both groups finished: Kueue holds no quota for them.
for i in $(seq 1 100); do
  used="$("$KUBECTL" get clusterqueue "$CQ" -o jsonpath='{.status.admittedWorkloads}' 2>/dev/null)"
  [ "$used" = 0 ] && break
  sleep 0.2
done
[ "$used" = 0 ] || fail "ClusterQueue $CQ still has $used admitted workloads after both jobs finished"
echo "--- kubectl get dtj,workloads"
k get dtj
k get workloads

if [ "$failures" != 0 ]; then
  echo "kueue e2e: $failures failure(s) in $((SECONDS - start)) s"
  exit 1
fi
echo "kueue e2e: ok in $((SECONDS - start)) s"
