#!/usr/bin/env bash
# e2e on the real node (scripts/node.sh: kubelet, containerd + runc, CNI bridge,
# CoreDNS, kube-proxy): the images CI builds run as real pods.
#   tests/e2e/with_node.sh bash tests/e2e/real_node_test.sh BUILD_DIR
# Checks, each printed as it passes:
#   1. the worker and operator images (scripts/build-images.sh, as OCI archives)
#      are imported into the node's containerd;
#   2. `helm install charts/distrain` into a namespace enforcing the restricted
#      Pod Security Standard: the operator's pods run from its image with pod IPs
#      of their own, one holds the Lease, talking to the API server in-cluster
#      (the `kubernetes` Service through kube-proxy); `helm test` passes (the
#      chart's Service by its DNS name through CoreDNS, its ClusterIP through
#      kube-proxy);
#   3. every CPU strategy example (training shortened), its pods from the worker
#      image: `kubectl wait --for=condition=Succeeded`; status.progress at N of N
#      with a loss; the chief's final accuracy in `kubectl logs` (the kubelet's
#      log endpoint); `kubectl get dtj` printer columns; events in `kubectl
#      describe dtj`; the checkpoint claim Bound; each pod its own IP in the
#      node's pod subnet (MultiWorkerMirrored's replicas reach each other by
#      their Services' DNS names, all on the same port);
#      `helm test` fails with the operator scaled to 0 and passes again after;
#      the ParameterServer example's Evaluator evaluates the final checkpoint;
#   4. chaos: a MultiWorkerMirrored job's random worker container SIGKILLed
#      through containerd ten times: each pod replaced alone, rejoining the
#      survivors in place (the chief never restarts), a Restarting event each,
#      and the job ends at the loss the same job without faults ends at; its
#      chief's container SIGKILLed after a checkpoint: the new chief pod resumes
#      from it on the provisioned claim; a OneDevice worker SIGSTOPped: Stalled
#      within 40 s, the pod replaced, Succeeded; a ParameterServer job scaled
#      2 -> 4 -> 2 with `kubectl scale`: the added workers run closures, leave
#      the worker set on the scale-down, and every step is done once; a
#      MultiWorkerMirrored job scaled 4 -> 2 -> 4 replicas in place: the
#      removed workers depart, the rest train on as a group of 2 and grow back
#      to 4, the survivors' pods never replaced, the step never going back;
#   5. `helm uninstall` and the namespace deleted: nothing of the release is left,
#      and the namespace goes (the kubelet really stopped its pods).
# The operator's replicas get the worker image from the chart (workerImage,
# following image.tag): the examples are applied as a user writes them.
# E2E_CASES="onedevice kill" runs a subset; E2E_KEEP=1 keeps the namespace.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BUILD="$(cd "${1:?usage: real_node_test.sh BUILD_DIR}" && pwd)"
: "${KUBECONFIG:?run through tests/e2e/with_node.sh}"
KUBECTL="${DISTRAIN_KUBE_BINDIR:?run through tests/e2e/with_node.sh}/kubectl"
NODE_SH="${DISTRAIN_NODE_SH:-$ROOT/scripts/node.sh}"
CP="${DISTRAIN_CONTROL_PLANE:-$ROOT/scripts/control-plane.sh}"
WAIT_S="${E2E_WAIT_S:-300}"
CASES="${E2E_CASES:-onedevice mirrored central-storage multi-worker-mirrored parameter-server kill chief-kill stall ps-scale mwms-scale}"
POD_NET="${DISTRAIN_NODE_POD_NET:-10.244.0}"
# shellcheck source=tests/e2e/e2e_lib.sh
. "$ROOT/tests/e2e/e2e_lib.sh"
e2e_preflight
TAG="$E2E_TAG"
WORKER_IMAGE="$E2E_WORKER_IMAGE"
HELM="$("$CP" helmbin 2>/dev/null)" || { echo "FAIL: no helm (scripts/control-plane.sh build builds it)"; exit 1; }

NS="e2e-node-$$"
REL="dn$$"
WORK="$(mktemp -d /tmp/distrain-e2e-node.XXXXXX)"
dump() {
  echo "--- kubectl get dtj,pods -o wide"
  k get dtj,pods -o wide 2>&1
  k get events --sort-by=.lastTimestamp 2>&1 | tail -n 20
  local p
  for p in $(k get pods -o name 2>/dev/null | grep -E "${1:-.}"); do
    echo "--- kubectl logs $p (last 10 lines)"
    k logs "$p" --tail=10 2>&1
  done
}
cleanup() {
  local p
  for p in $(jobs -p); do kill "$p" 2>/dev/null; done
  if [ -z "${E2E_KEEP:-}" ]; then
    "$HELM" uninstall "$REL" -n "$NS" >/dev/null 2>&1
    "$KUBECTL" delete namespace "$NS" --wait=false >/dev/null 2>&1
  fi
  [ "$failures" = 0 ] && [ -z "${E2E_KEEP:-}" ] && rm -rf "$WORK"
  [ "$failures" = 0 ] || echo "--- files kept in $WORK; node logs in ${DISTRAIN_NODE_DIR:-/tmp/distrain-node}/logs"
}
trap cleanup EXIT
start=$SECONDS

# 1. The images, as CI builds them, in the node's containerd.
t0=$SECONDS
e2e_load_images ||
  { fail "scripts/node.sh load-images --build-dir $BUILD --tag $TAG failed (its messages are above)"; exit 1; }
images="$("$NODE_SH" ctr images ls -q)"
for img in "$WORKER_IMAGE" "localhost/distrain/operator:$TAG"; do
  grep -qx "$img" <<<"$images" || { fail "containerd lacks $img after load-images; it has: $images"; exit 1; }
done
ok "images $WORKER_IMAGE and localhost/distrain/operator:$TAG in the node's containerd ($((SECONDS - t0)) s)"

# 2. The chart, in a namespace that enforces the restricted Pod Security Standard.
e2e_namespace "$NS" || { fail "cannot create namespace $NS enforcing the restricted Pod Security Standard"; exit 1; }
t0=$SECONDS
if ! e2e_helm_install "$REL" "$NS" --set tests.wait=10s --wait --timeout 180s >"$WORK/install.log" 2>&1; then
  cat "$WORK/install.log"
  fail "helm install (the operator Deployment not ready within 180 s)"
  dump operator
  exit 1
fi
DEPLOY="$REL-distrain-operator"
leader="$(e2e_wait_leader "$DEPLOY" "$NS" 60)" || { fail "no operator pod took the Lease $NS/$DEPLOY within 60 s"; dump operator; exit 1; }
ips="$(k get pods -l "app.kubernetes.io/instance=$REL,app.kubernetes.io/component=operator" -o jsonpath='{range .items[*]}{.status.podIP}{"\n"}{end}')"
grep -qvE "^${POD_NET//./\\.}\.[0-9]+$" <<<"$ips" && fail "operator pod IPs are not in the node's pod subnet $POD_NET.0/24: $ips"
[ "$(sort -u <<<"$ips" | wc -l)" = "$(wc -l <<<"$ips")" ] || fail "operator pods share an IP: $ips"
# In-cluster: the kubelet's KUBERNETES_SERVICE_HOST is the `kubernetes` Service's
# ClusterIP; kube-proxy routes it to the API server on the node's address.
api="https://$("$KUBECTL" -n default get svc kubernetes -o jsonpath='{.spec.clusterIP}'):443"
k logs "$leader" 2>&1 | grep "against $api" >/dev/null ||
  fail "the leader $leader does not log the in-cluster API address $api: $(k logs "$leader" 2>&1 | head -n 5)"
# Its identity, from inside its container (kubectl exec: the API server, the
# kubelet's streaming server, containerd): the projected token is the chart's
# ServiceAccount's, bound to this pod.
token="$(k exec "$leader" -- cat /var/run/secrets/kubernetes.io/serviceaccount/token 2>&1)"
k exec "$leader" -- cat /var/run/secrets/kubernetes.io/serviceaccount/ca.crt >"$WORK/ca.crt" 2>&1
server="$("$KUBECTL" config view --minify -o jsonpath='{.clusters[0].cluster.server}')"
whoami="$("$KUBECTL" auth whoami --kubeconfig=/dev/null --server="$server" --certificate-authority="$WORK/ca.crt" \
  --token="$token" -o jsonpath='{.status.userInfo.username} {.status.userInfo.extra.authentication\.kubernetes\.io/pod-name[0]}' 2>&1)"
[ "$whoami" = "system:serviceaccount:$NS:$REL-distrain $leader" ] ||
  fail "the leader's token (read with kubectl exec) is '$whoami' (want system:serviceaccount:$NS:$REL-distrain bound to $leader)"
# Cluster DNS from inside a pod: Service names resolve (through the pod's search
# path), a name outside the cluster does not (never the host's resolver).
svc_ip="$(k exec "$leader" -- getent hosts "$REL-distrain-operator-metrics" 2>&1 | awk '{print $1}')"
[ -n "$svc_ip" ] && [ "$svc_ip" = "$(k get svc "$REL-distrain-operator-metrics" -o jsonpath='{.spec.clusterIP}')" ] ||
  fail "the Service $REL-distrain-operator-metrics does not resolve to its ClusterIP in a pod (got '$svc_ip')"
k exec "$leader" -- getent hosts deb.debian.org >/dev/null 2>&1 &&
  fail "a pod resolved deb.debian.org: its DNS reaches beyond the cluster"
ok "helm install: $(wc -l <<<"$ips") operator pods from localhost/distrain/operator:$TAG, IPs $(tr '\n' ' ' <<<"$ips"), $leader leads ($((SECONDS - t0)) s)"
t0=$SECONDS
if "$HELM" test "$REL" -n "$NS" --timeout 120s >"$WORK/helm-test.log" 2>&1; then
  ok "helm test: the operator's Service by DNS name and ClusterIP ($((SECONDS - t0)) s)"
else
  cat "$WORK/helm-test.log"
  k logs "$REL-distrain-test-operator" 2>&1 | tail -n 10
  fail "helm test"
fi

# `helm test` must be able to fail: no operator replica, no pass.
t0=$SECONDS
k scale deployment "$DEPLOY" --replicas=0 >/dev/null && k rollout status deployment "$DEPLOY" --timeout=60s >/dev/null ||
  fail "scaling $DEPLOY to 0"
k wait --for=delete pod -l "app.kubernetes.io/instance=$REL,app.kubernetes.io/component=operator" --timeout=60s >/dev/null 2>&1
if "$HELM" test "$REL" -n "$NS" --timeout 60s >"$WORK/helm-test-0.log" 2>&1; then
  fail "helm test passed with the operator scaled to 0"
else
  ok "helm test fails with the operator scaled to 0 ($((SECONDS - t0)) s)"
fi
k scale deployment "$DEPLOY" --replicas=2 >/dev/null && k rollout status deployment "$DEPLOY" --timeout=120s >/dev/null ||
  fail "scaling $DEPLOY back to 2"
e2e_wait_leader "$DEPLOY" "$NS" 60 >/dev/null || fail "no operator pod took the Lease again after scaling back"
"$HELM" test "$REL" -n "$NS" --timeout 120s >"$WORK/helm-test.log" 2>&1 && ok "helm test passes again" ||
  { cat "$WORK/helm-test.log"; fail "helm test after scaling back"; }

# 3. Every CPU strategy example as a user writes it (no template): its pods
# from the worker image the chart gives the operator.
job_yaml() {  # EXAMPLE STEPS NAME
  e2e_example "$ROOT/examples/$1.yaml" "$2" | sed -E -e "s/^  name: $1\$/  name: $3/"
}

check_job() {
  local job="$1" t0=$SECONDS
  if ! k wait --for=condition=Succeeded "dtj/$job" --timeout="${WAIT_S}s" >/dev/null; then
    fail "$job: did not reach Succeeded within ${WAIT_S}s"
    dump "$job"
    return
  fi
  local total step loss
  total="$(k get dtj "$job" -o jsonpath='{.status.progress.totalSteps}')"
  step="$(k get dtj "$job" -o jsonpath='{.status.progress.step}')"
  loss="$(k get dtj "$job" -o jsonpath='{.status.progress.loss}')"
  [ "$total" = 150 ] && [ "$step" = 150 ] || fail "$job: status.progress is step '$step' of '$total' (want 150 of 150)"
  [ -n "$loss" ] || fail "$job: status.progress has no final loss"
  # No pod of it keeps running once it succeeded (ps tasks never exit on their own).
  local running="" i
  for i in $(seq 1 150); do
    running="$(k get pods -l "distrain.io/job-name=$job" --field-selector=status.phase!=Succeeded,status.phase!=Failed \
      -o jsonpath='{.items[*].metadata.name}' 2>&1)"
    [ -z "$running" ] && break
    sleep 0.2
  done
  [ -z "$running" ] || fail "$job: pods still running 30 s after it succeeded: $running"
  local claim
  claim="$(k get pvc "$job-checkpoints" -o jsonpath='{.status.phase} {.metadata.ownerReferences[0].name}' 2>&1)"
  [ "$claim" = "Bound $job" ] || fail "$job: PVC $job-checkpoints is '$claim' (want Bound, owned by the job)"
  local chief logs
  if k get pod "$job-chief-0" >/dev/null 2>&1; then chief="$job-chief-0"; else chief="$job-worker-0"; fi
  [ "$(k get pod "$chief" -o jsonpath='{.spec.containers[0].image}')" = "$WORKER_IMAGE" ] ||
    fail "$job: $chief does not run $WORKER_IMAGE"
  logs="$(k logs "$chief" 2>&1)"
  grep -Eq "training complete: .*accuracy [0-9.]+" <<<"$logs" ||
    fail "$job: no final accuracy line in 'kubectl logs $chief'; got: $(tail -n 3 <<<"$logs")"
  local tail1
  tail1="$(k logs "$chief" --tail=1 2>&1)"
  [ "$(wc -l <<<"$tail1")" = 1 ] && [ "$tail1" = "$(tail -n 1 <<<"$logs")" ] ||
    fail "$job: 'kubectl logs --tail=1 $chief' is not the log's last line: $tail1"
  local get
  get="$(k get dtj "$job" 2>&1)"
  grep -Eq "^NAME +STRATEGY +STATE +WORKERS +STEP +AGE" <<<"$get" || fail "$job: 'kubectl get dtj' lacks the printer columns: $get"
  grep -Eq "^$job +[A-Za-z]+ +Succeeded " <<<"$get" || fail "$job: 'kubectl get dtj' row: $get"
  local describe
  describe="$(k describe dtj "$job" 2>&1)"
  grep -Eq "^Events:" <<<"$describe" && ! grep -q "^Events: *<none>" <<<"$describe" ||
    fail "$job: 'kubectl describe dtj' shows no events"
  if [ "$job" = parameter-server ]; then
    # The Evaluator found the checkpoint directory on the claim and evaluated the
    # last checkpoint. Its log as followed while it ran: the pod may be gone by
    # now (cleanPodPolicy Running deletes it when the chief succeeds).
    local ev="$WORK/$job-evaluator-0.log"
    for i in $(seq 1 150); do
      grep "evaluated the final checkpoint (step 150)" "$ev" >/dev/null 2>&1 && break
      sleep 0.2
    done
    grep "evaluated the final checkpoint (step 150)" "$ev" >/dev/null 2>&1 ||
      fail "$job: the Evaluator did not evaluate the final checkpoint; its log: $(tail -n 3 "$ev" 2>&1)"
  fi
  # Real pod networking: every replica its own IP in the node's subnet.
  local ips n
  ips="$(k get pods -l "distrain.io/job-name=$job" -o jsonpath='{range .items[*]}{.status.podIP}{"\n"}{end}' | sed '/^$/d')"
  n="$(k get pods -l "distrain.io/job-name=$job" -o name | wc -l)"
  if [ -n "$ips" ]; then
    grep -qvE "^${POD_NET//./\\.}\.[0-9]+$" <<<"$ips" && fail "$job: pod IPs outside $POD_NET.0/24: $ips"
    [ "$(sort -u <<<"$ips" | wc -l)" = "$(wc -l <<<"$ips")" ] || fail "$job: pods share an IP: $ips"
  fi
  echo "ok: $job Succeeded at step $step/$total, loss $loss, $n pods left (waited $((SECONDS - t0)) s after the previous check)"
  echo "    $(grep -E 'training complete' <<<"$logs" | tail -n 1 | sed 's/^.*training complete/training complete/')"
}

# 4. Chaos, in-place recovery (docs/architecture.md §6b): the MultiWorkerMirrored
# example (chief + 3 workers) loses a random worker's container to SIGKILL
# through containerd (as the OOM killer or a crash ends it) E2E_CHAOS_KILLS
# times (default 10), each once the group has recovered from the previous one.
# The operator replaces only the killed pod (one restart each, a Restarting
# event); the chief's pod is never replaced and never exits; each loss costs at
# most the step in flight (the survivors resume at a step no lower than the one
# they had completed); the job Succeeds with step N of N and its final loss
# within 1% of the same job run without faults.
# Follows a MultiWorkerMirrored job (1 chief + 3 workers): the chief's log into
# LOG and every incarnation of every worker under $WORK/JOB (for the diagnosis
# when a recovery fails); returns once the chief logged a step of STEPS.
follow_mwms() {
  local job="$1" steps="$2" log="$3" i p
  e2e_follow_log "$NS" "$job-chief-0" "$log" </dev/null >/dev/null 2>&1 &
  mkdir -p "$WORK/$job"
  for p in 0 1 2; do e2e_follow_incarnations "$NS" "$job-worker-$p" "$WORK/$job" </dev/null >/dev/null 2>&1 & done
  for i in $(seq 1 600); do
    grep -Eq "step [0-9]+/$steps" "$log" 2>/dev/null && return 0
    sleep 0.5
  done
  fail "$job: the chief never logged a step"
  dump "$job"
  return 1
}

run_kill() {
  local job=mwms-kill clean=mwms-clean steps="${E2E_CHAOS_STEPS:-2500}" kills="${E2E_CHAOS_KILLS:-10}"
  job_yaml multi-worker-mirrored "$steps" "$job" >"$WORK/$job.yaml"
  k apply -f "$WORK/$job.yaml" >/dev/null || { fail "$job: kubectl apply failed"; return; }
  local log="$WORK/$job-chief-0.log" i n p
  follow_mwms "$job" "$steps" "$log" || return
  local chief_uid
  chief_uid="$(k get pod "$job-chief-0" -o jsonpath='{.metadata.uid}')"
  local -a killed_count=(0 0 0)
  local worst=0
  for n in $(seq 1 "$kills"); do
    local w=$((RANDOM % 3)) t0 recovered=0 state=""
    # The previous replacement must be running before it can be killed again.
    for i in $(seq 1 300); do
      state="$(k get pod "$job-worker-$w" -o jsonpath='{.status.containerStatuses[0].state.running.startedAt}' 2>/dev/null)"
      [ -n "$state" ] && break
      sleep 0.2
    done
    [ -n "$state" ] || { fail "$job: worker-$w has no running container before kill $n"; dump "$job"; return; }
    grep -q "training complete" "$log" && { fail "$job: finished after $((n - 1)) kills; raise E2E_CHAOS_STEPS"; return; }
    t0=$SECONDS
    e2e_kill_container "$NS" "$job-worker-$w" SIGKILL || { fail "$job: killing worker-$w's container failed"; return; }
    killed_count[$w]=$((killed_count[$w] + 1))
    # Recovered: the chief logged its n-th in-place recovery.
    for i in $(seq 1 1200); do
      recovered="$(grep -c "recovered in place" "$log")"
      [ "$recovered" -ge "$n" ] && break
      sleep 0.1
    done
    if [ "$recovered" -lt "$n" ]; then
      fail "$job: the chief did not recover from kill $n (worker-$w) within 120 s"
      dump "$job"
      for p in "$log" "$WORK/$job"/*.log; do
        echo "--- $(basename "$p"): what it logged besides steps"
        grep -v " step [0-9]*/" "$p" | tail -n 8 | cut -c1-400
      done
      return
    fi
    [ $((SECONDS - t0)) -gt "$worst" ] && worst=$((SECONDS - t0))
    echo "kill $n: worker-$w's container; $(grep "recovered in place" "$log" | tail -n 1 | sed 's/^.*recovered/recovered/')"
  done
  if ! k wait --for=condition=Succeeded "dtj/$job" --timeout="${WAIT_S}s" >/dev/null; then
    fail "$job: did not reach Succeeded after $kills kills"
    dump "$job"
    return
  fi
  # Survivors untouched: the chief's pod is the one it started with, and each
  # worker pod was replaced exactly as often as it was killed.
  [ "$(k get pod "$job-chief-0" -o jsonpath='{.metadata.uid}' 2>/dev/null)" = "$chief_uid" ] ||
    [ -z "$(k get pod "$job-chief-0" -o name 2>/dev/null)" ] || fail "$job: the chief's pod was replaced"
  local restarts worker_restarts chief_restarts
  restarts="$(k get dtj "$job" -o jsonpath='{.status.restartCount}')"
  [ "$restarts" = "$kills" ] || fail "$job: status.restartCount is '$restarts' after $kills kills (want $kills: one pod each)"
  worker_restarts="$(k get dtj "$job" -o jsonpath='{.status.replicaStatuses.Worker.restarts}')"
  [ "$worker_restarts" = "$kills" ] || fail "$job: replicaStatuses.Worker.restarts '$worker_restarts' (want $kills)"
  chief_restarts="$(k get dtj "$job" -o jsonpath='{.status.replicaStatuses.Chief.restarts}')"
  [ "${chief_restarts:-0}" = 0 ] || fail "$job: the chief was restarted ($chief_restarts)"
  grep -q "exit code" "$log" && fail "$job: the chief logged an exit: $(grep 'exit code' "$log" | head -n 1)"
  k describe dtj "$job" | grep -E "Restarting .*$job-worker-[0-9]" >/dev/null ||
    fail "$job: 'kubectl describe dtj' shows no Restarting event naming a worker of $job"
  # At most the step in flight lost: nobody resumed behind what it had completed.
  local back
  back="$(grep -Eo "resuming at step [0-9]+ \(this process had completed [0-9]+\)" "$log" |
    awk '{ if ($4 < $9 + 0) print }' | head -n 1)"
  [ -z "$back" ] || fail "$job: the chief went back: $back"
  local step loss
  step="$(k get dtj "$job" -o jsonpath='{.status.progress.step}')"
  loss="$(k get dtj "$job" -o jsonpath='{.status.progress.loss}')"
  [ "$step" = "$steps" ] || fail "$job: status.progress.step is '$step' (want $steps)"
  ok "$job Succeeded after $kills worker kills (${killed_count[*]} per worker), slowest recovery ${worst}s; loss $loss"
  # The same job without faults ends at the same loss (within 1%).
  sed -e "s/^  name: $job/  name: $clean/" "$WORK/$job.yaml" >"$WORK/$clean.yaml"
  k apply -f "$WORK/$clean.yaml" >/dev/null || { fail "$clean: kubectl apply failed"; return; }
  if ! k wait --for=condition=Succeeded "dtj/$clean" --timeout="${WAIT_S}s" >/dev/null; then
    fail "$clean: did not reach Succeeded"
    dump "$clean"
    return
  fi
  local clean_loss
  clean_loss="$(k get dtj "$clean" -o jsonpath='{.status.progress.loss}')"
  if awk -v a="$loss" -v b="$clean_loss" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(b > 0 && d <= 0.01 * b) }'; then
    ok "final loss $loss after the kills, $clean_loss without (within 1%)"
  else
    fail "$job: final loss $loss after the kills vs $clean_loss without faults (want within 1%)"
  fi
}

# The chief SIGKILLed after a checkpoint (no SIGTERM, so no checkpoint of its
# own at exit), with no volume in the spec: the restarted chief, a new pod,
# resumes from that checkpoint on the claim the node's provisioner backs.
run_chief_kill() {
  local job=mwms-chief-kill i saved="" cid
  job_yaml multi-worker-mirrored 600 "$job" | sed -E 's/^(      everySteps:) [0-9]+/\1 50/' >"$WORK/$job.yaml"
  grep -q "volume:" "$WORK/$job.yaml" && { fail "$job: the example names a volume; this case needs none"; return; }
  k apply -f "$WORK/$job.yaml" >/dev/null || { fail "$job: kubectl apply failed"; return; }
  for i in $(seq 1 600); do
    saved="$(k logs "$job-chief-0" 2>/dev/null | grep -Eo "checkpoint step [0-9]+ written" | tail -n 1 | grep -Eo "[0-9]+")"
    [ -n "$saved" ] && break
    sleep 0.5
  done
  [ -n "$saved" ] || { fail "$job: the chief never wrote a checkpoint"; dump "$job"; return; }
  e2e_kill_container "$NS" "$job-chief-0" SIGKILL || { fail "$job: killing $job-chief-0's container failed"; return; }
  echo "killed $job-chief-0's container after its checkpoint at step $saved"
  local resumed=""
  for i in $(seq 1 600); do
    resumed="$(k logs "$job-chief-0" 2>/dev/null | grep -Eo "resumed from checkpoint step [0-9]+" | grep -Eo "[0-9]+" | tail -n 1)"
    [ -n "$resumed" ] && break
    sleep 0.5
  done
  if [ -n "$resumed" ] && [ "$resumed" -ge "$saved" ] 2>/dev/null && [ "$resumed" -gt 0 ]; then
    ok "$job's restarted chief resumed from checkpoint step $resumed"
  else
    fail "$job: the restarted chief did not resume from a checkpoint at step >= $saved (got '$resumed')"
    dump "$job"
    return
  fi
  k wait --for=condition=Succeeded "dtj/$job" --timeout="${WAIT_S}s" >/dev/null ||
    { fail "$job: did not reach Succeeded after the chief was killed"; dump "$job"; return; }
  ok "$job Succeeded after the chief was killed; restartCount $(k get dtj "$job" -o jsonpath='{.status.restartCount}')"
}

# A OneDevice worker SIGSTOPped through containerd: only its progress shows the
# hang. Deadline 10 s (+ the operator's 10 s scrape slack): Stalled within 40 s,
# an event naming the pod, the pod replaced (the kubelet SIGKILLs the stopped
# process after its 2 s grace period), and the job succeeds with Stalled
# cleared. The template's tcpSocket liveness probe, which a stopped process's
# listening socket still passes, keeps the kubelet from racing the operator.
run_stall() {
  local job=onedevice-stall i
  # 6000 steps: ten times what it has run when it is stopped (234 to 603 so far), and
  # what the replacement, which starts again from step 0, must run to the end.
  e2e_example "$ROOT/examples/onedevice.yaml" 6000 | sed -E \
    -e "s/^  name: onedevice/  name: $job/" -e 's/^(      everySteps:) [0-9]+/\1 2000/' \
    -e "s#^(      replicas: 1)\$#\1\n      template: {spec: {terminationGracePeriodSeconds: 2, containers: [{name: distrain, livenessProbe: {tcpSocket: {port: metrics}}}]}}#" \
    -e "s/^(  training:)\$/  runPolicy: {progressDeadlineSeconds: 10}\n\1/" >"$WORK/$job.yaml"
  grep -q "progressDeadlineSeconds: 10" "$WORK/$job.yaml" && grep -q "terminationGracePeriodSeconds: 2" "$WORK/$job.yaml" ||
    { fail "$job: could not write the job: $(cat "$WORK/$job.yaml")"; return; }
  k apply -f "$WORK/$job.yaml" >/dev/null || { fail "$job: kubectl apply failed"; return; }
  # Stopped once the operator has seen it step after it started (see examples_test.sh).
  local seen="" started=""
  for i in $(seq 1 600); do
    seen="$(k get dtj "$job" -o jsonpath='{.status.progress.lastStepTime}' 2>/dev/null)"
    started="$(k get pod "$job-worker-0" -o jsonpath='{.status.containerStatuses[0].state.running.startedAt}' 2>/dev/null)"
    [ -n "$seen" ] && [ -n "$started" ] && [[ "$seen" > "$started" ]] && break
    sleep 0.2
  done
  [ -n "$seen" ] && [[ "$seen" > "$started" ]] ||
    { fail "$job: status.progress.lastStepTime ('$seen') never passed the start ('$started')"; dump "$job"; return; }
  local uid cid
  uid="$(k get pod "$job-worker-0" -o jsonpath='{.metadata.uid}')"
  cid="$(k get pod "$job-worker-0" -o jsonpath='{.status.containerStatuses[0].containerID}')"
  e2e_kill_container "$NS" "$job-worker-0" SIGSTOP || { fail "$job: stopping $job-worker-0's container failed"; return; }
  local stopped_at=$SECONDS stalled=""
  echo "stopped $job-worker-0's container at progress step $(k get dtj "$job" -o jsonpath='{.status.progress.step}')"
  for i in $(seq 1 250); do
    stalled="$(k get dtj "$job" -o jsonpath='{.status.conditions[?(@.type=="Stalled")].status}')"
    [ "$stalled" = True ] && break
    sleep 0.2
  done
  if [ "$stalled" = True ] && [ $((SECONDS - stopped_at)) -le 40 ]; then
    ok "$job Stalled $((SECONDS - stopped_at)) s after the stop"
  else
    fail "$job: Stalled is '$stalled' $((SECONDS - stopped_at)) s after the stop (want True within 40 s)"
    "$NODE_SH" ctr tasks kill -s SIGCONT "${cid#containerd://}" 2>/dev/null
    dump "$job"
    return
  fi
  k describe dtj "$job" | grep -E "ProgressDeadlineExceeded.*pod $job-worker-0" >/dev/null ||
    fail "$job: no ProgressDeadlineExceeded event naming pod $job-worker-0"
  local new_uid=""
  for i in $(seq 1 300); do
    new_uid="$(k get pod "$job-worker-0" -o jsonpath='{.metadata.uid}' 2>/dev/null)"
    [ -n "$new_uid" ] && [ "$new_uid" != "$uid" ] && break
    sleep 0.2
  done
  [ -n "$new_uid" ] && [ "$new_uid" != "$uid" ] || fail "$job: pod $job-worker-0 was not replaced"
  k wait --for=condition=Succeeded "dtj/$job" --timeout="${WAIT_S}s" >/dev/null ||
    { fail "$job: did not reach Succeeded after the stall"; dump "$job"; return; }
  local still
  still="$(k get dtj "$job" -o jsonpath='{.status.conditions[?(@.type=="Stalled")].status}')"
  [ "$still" = False ] || fail "$job: Stalled is '$still' after success (want False)"
  ok "$job Succeeded after the stall; restartCount $(k get dtj "$job" -o jsonpath='{.status.restartCount}'), Stalled $still"
}

# ParameterServer scaled in place (docs/architecture.md §6b, worker/strategy/
# ps_membership.h): the example, elastic within [2, 4], is scaled 2 -> 4 with
# `kubectl scale` while it trains. The pods the scale adds join the chief's
# worker set and complete closures (the chief's per-worker counter
# distrain_ps_worker_closures_completed_total, read from its pod's IP, and its
# final per-worker line). Then 4 -> 2: the operator deletes the two added
# pods (SIGTERM: they leave the set first), and the job Succeeds with every
# requested step done, each counted once; the chief's pod is never replaced.
run_ps_scale() {
  local job=ps-scale steps=8000
  job_yaml parameter-server "$steps" "$job" | sed -E -e 's/^(      everySteps:) [0-9]+/\1 2000/' \
    -e "s/^(  strategy: ParameterServer)\$/\1\n  elasticPolicy: {minReplicas: 2, maxReplicas: 4}/" >"$WORK/$job.yaml"
  grep -q "maxReplicas: 4" "$WORK/$job.yaml" || { fail "$job: could not write the job: $(cat "$WORK/$job.yaml")"; return; }
  k apply -f "$WORK/$job.yaml" >/dev/null || { fail "$job: kubectl apply failed"; return; }
  local log="$WORK/$job-chief-0.log" i
  e2e_follow_log "$NS" "$job-chief-0" "$log" </dev/null >/dev/null 2>&1 &
  for i in $(seq 1 900); do
    grep -Eq "step [0-9]{3,}/$steps" "$log" 2>/dev/null && break
    sleep 0.2
  done
  grep -Eq "step [0-9]{3,}/$steps" "$log" 2>/dev/null || { fail "$job: the chief never reached step 100"; dump "$job"; return; }
  local chief_uid
  chief_uid="$(k get pod "$job-chief-0" -o jsonpath='{.metadata.uid}')"
  k scale dtj "$job" --replicas 4 >/dev/null || { fail "$job: kubectl scale --replicas 4 failed"; dump "$job"; return; }
  local scaled=$SECONDS ip port metrics="" w2="" w3=""
  ip="$(k get pod "$job-chief-0" -o jsonpath='{.status.podIP}')"
  port="$(k get pod "$job-chief-0" -o jsonpath='{.spec.containers[0].ports[?(@.name=="metrics")].containerPort}')"
  for i in $(seq 1 600); do
    metrics="$(curl -fsS --max-time 2 "http://$ip:${port:-9090}/metrics" 2>/dev/null)"
    w2="$(grep -E '^distrain_ps_worker_closures_completed_total\{worker="worker:2"\}' <<<"$metrics" | awk '{print $2}')"
    w3="$(grep -E '^distrain_ps_worker_closures_completed_total\{worker="worker:3"\}' <<<"$metrics" | awk '{print $2}')"
    [ -n "$w2" ] && [ -n "$w3" ] && awk "BEGIN{exit !($w2 > 0 && $w3 > 0)}" && break
    sleep 0.2
  done
  if [ -n "$w2" ] && [ -n "$w3" ] && awk "BEGIN{exit !($w2 > 0 && $w3 > 0)}"; then
    ok "$job scaled 2 -> 4: worker:2 and worker:3 completed $w2 and $w3 closures $((SECONDS - scaled)) s after kubectl scale"
  else
    fail "$job: the added workers completed no closure within 120 s of kubectl scale (worker:2 '$w2', worker:3 '$w3'; chief $ip:${port:-9090})"
    dump "$job"
    return
  fi
  grep -q "training complete" "$log" && { fail "$job: finished before the scale-down; raise its steps"; return; }
  k scale dtj "$job" --replicas 2 >/dev/null || { fail "$job: kubectl scale --replicas 2 failed"; dump "$job"; return; }
  for i in $(seq 1 300); do
    grep -q "worker:3 (.*) is out of the worker set" "$log" 2>/dev/null &&
      grep -q "worker:2 (.*) is out of the worker set" "$log" 2>/dev/null && break
    sleep 0.2
  done
  grep -q "worker:3 (.*) is out of the worker set" "$log" ||
    fail "$job: the chief never took worker:3 out of its worker set after the scale-down"
  if ! k wait --for=condition=Succeeded "dtj/$job" --timeout="${WAIT_S}s" >/dev/null; then
    fail "$job: did not reach Succeeded after scaling 2 -> 4 -> 2"
    dump "$job"
    return
  fi
  for i in $(seq 1 100); do
    grep -q "closures per worker: " "$log" && break
    sleep 0.2
  done
  local done_line per_worker
  done_line="$(grep -Eo "[0-9]+ closure\(s\) completed, [0-9]+ retried" "$log" | tail -n 1)"
  per_worker="$(grep -Eo "closures per worker: .*" "$log" | tail -n 1)"
  [ "${done_line%% *}" = "$steps" ] || fail "$job: '$done_line' (want $steps closures completed, each once)"
  grep -Eq "worker:2 [1-9][0-9]*, worker:3 [1-9][0-9]*" <<<"$per_worker" ||
    fail "$job: the added workers ran no closure by the chief's count: $per_worker"
  [ "$(k get pod "$job-chief-0" -o jsonpath='{.metadata.uid}' 2>/dev/null)" = "$chief_uid" ] ||
    [ -z "$(k get pod "$job-chief-0" -o name 2>/dev/null)" ] ||
    fail "$job: the chief's pod was replaced by the scale"
  ok "$job Succeeded after 2 -> 4 -> 2: $done_line; $per_worker"
}

# MultiWorkerMirrored resized in place (worker/strategy/multi_worker_mirrored.h
# E1-E4, operator/controller/elastic.h): the example (1 chief + 3 workers,
# global batch 128), elastic within [1, 3] workers, is scaled to 1 worker and
# back to 3 with `kubectl scale` while it trains. The scale-down deletes
# worker-1 and worker-2 (SIGTERM: they depart) and the chief and worker-0 go on
# as a group of 2 (128 / 2 each step: the same global batch); the scale-up's
# new pods join and the group is 4 again. The survivors' pods are the ones
# they started as, never restarted; nobody resumes behind a step it had
# completed; the job Succeeds at N of N with no restart counted.
# kubectl scale JOB to REPLICAS Workers, then wait (120 s) for the chief's LOG
# to say WANT; on failure, the job and what its processes logged besides steps.
scale_until() {
  local job="$1" replicas="$2" want="$3" log="$4" i p
  k scale dtj "$job" --replicas "$replicas" >/dev/null ||
    { fail "$job: kubectl scale --replicas $replicas failed"; dump "$job"; return 1; }
  for i in $(seq 1 600); do
    grep -q "$want" "$log" 2>/dev/null && return 0
    sleep 0.2
  done
  fail "$job: the chief did not log '$want' within 120 s of kubectl scale --replicas $replicas"
  dump "$job"
  for p in "$log" "$WORK/$job"/*.log; do
    echo "--- $(basename "$p"): what it logged besides steps"
    grep -v " step [0-9]*/" "$p" | tail -n 8 | cut -c1-400
  done
  return 1
}

# Waits (60 s) until LOG has N "recovered in place" lines.
recoveries_reach() {
  local log="$1" n="$2" i
  for i in $(seq 1 300); do
    [ "$(grep -c "recovered in place" "$log" 2>/dev/null)" -ge "$n" ] && return 0
    sleep 0.2
  done
  return 1
}

run_mwms_scale() {
  local job=mwms-scale steps="${E2E_SCALE_STEPS:-3000}"
  job_yaml multi-worker-mirrored "$steps" "$job" |
    sed -E -e "s/^(  strategy: MultiWorkerMirrored)\$/\1\n  elasticPolicy: {minReplicas: 1, maxReplicas: 3}/" >"$WORK/$job.yaml"
  grep -q "maxReplicas: 3" "$WORK/$job.yaml" || { fail "$job: could not write the job: $(cat "$WORK/$job.yaml")"; return; }
  k apply -f "$WORK/$job.yaml" >/dev/null || { fail "$job: kubectl apply failed"; return; }
  local log="$WORK/$job-chief-0.log" i p
  follow_mwms "$job" "$steps" "$log" || return
  local chief_uid w0_uid t0
  chief_uid="$(k get pod "$job-chief-0" -o jsonpath='{.metadata.uid}')"
  w0_uid="$(k get pod "$job-worker-0" -o jsonpath='{.metadata.uid}')"
  t0=$SECONDS
  scale_until "$job" 1 "now rank 0 of 2" "$log" || return
  recoveries_reach "$log" 1  # the resize is logged before the state agreement ends it
  local shrunk_at
  shrunk_at="$(grep -Eo "resuming at step [0-9]+" "$log" | tail -n 1 | awk '{print $4}')"
  ok "$job 4 -> 2 in place $((SECONDS - t0)) s after kubectl scale: resumed at step $shrunk_at as a group of 2"
  # Two processes train on: a logged step past the resize.
  for i in $(seq 1 300); do
    [ "$(grep -Eo "step [0-9]+/$steps" "$log" | tail -n 1 | sed -E 's/step ([0-9]+)\/.*/\1/')" -gt "$shrunk_at" ] 2>/dev/null && break
    sleep 0.2
  done
  grep -q "training complete" "$log" && { fail "$job: finished before the scale-up; raise E2E_SCALE_STEPS"; return; }
  t0=$SECONDS
  scale_until "$job" 3 "now rank 0 of 4" "$log" || return
  recoveries_reach "$log" 2
  ok "$job 2 -> 4 in place $((SECONDS - t0)) s after kubectl scale: $(grep "recovered in place" "$log" | tail -n 1 | sed 's/^.*recovered/recovered/')"
  if ! k wait --for=condition=Succeeded "dtj/$job" --timeout="${WAIT_S}s" >/dev/null; then
    fail "$job: did not reach Succeeded after 4 -> 2 -> 4"
    dump "$job"
    return
  fi
  local uid restarts
  for p in chief-0:$chief_uid worker-0:$w0_uid; do
    uid="$(k get pod "$job-${p%%:*}" -o jsonpath='{.metadata.uid}' 2>/dev/null)"
    [ -z "$uid" ] || [ "$uid" = "${p#*:}" ] || fail "$job: $job-${p%%:*} was replaced by the resize"
    restarts="$(k get pod "$job-${p%%:*}" -o jsonpath='{.status.containerStatuses[0].restartCount}' 2>/dev/null)"
    [ "${restarts:-0}" = 0 ] || fail "$job: $job-${p%%:*}'s container restarted $restarts times"
  done
  restarts="$(k get dtj "$job" -o jsonpath='{.status.restartCount}')"
  [ "${restarts:-0}" = 0 ] || fail "$job: status.restartCount is '$restarts' after resizes (want 0: a resize is not a failure)"
  grep -q "exit code" "$log" && fail "$job: the chief logged an exit: $(grep 'exit code' "$log" | head -n 1)"
  local back step
  back="$(grep -Eo "resuming at step [0-9]+ \(this process had completed [0-9]+\)" "$log" |
    awk '{ if ($4 < $9 + 0) print }' | head -n 1)"
  [ -z "$back" ] || fail "$job: the chief went back: $back"
  step="$(k get dtj "$job" -o jsonpath='{.status.progress.step}')"
  [ "$step" = "$steps" ] || fail "$job: status.progress.step is '$step' (want $steps)"
  ok "$job Succeeded after 4 -> 2 -> 4 in place: survivors never replaced, step $step of $steps"
}

jobs=()
for c in $CASES; do
  case "$c" in kill | chief-kill | stall | ps-scale | mwms-scale) continue ;; esac
  [ -f "$ROOT/examples/$c.yaml" ] || { fail "no example examples/$c.yaml (E2E_CASES)"; continue; }
  job_yaml "$c" 150 "$c" >"$WORK/$c.yaml"
  k apply -f "$WORK/$c.yaml" >/dev/null || { fail "$c: kubectl apply failed"; continue; }
  [ "$c" != parameter-server ] || e2e_follow_log "$NS" "$c-evaluator-0" "$WORK/$c-evaluator-0.log" </dev/null >/dev/null 2>&1 &
  jobs+=("$c")
done
for c in "${jobs[@]}"; do check_job "$c"; done
[[ " $CASES " == *" kill "* ]] && run_kill
[[ " $CASES " == *" chief-kill "* ]] && run_chief_kill
[[ " $CASES " == *" stall "* ]] && run_stall
[[ " $CASES " == *" ps-scale "* ]] && run_ps_scale
[[ " $CASES " == *" mwms-scale "* ]] && run_mwms_scale

# 5. Uninstall: nothing of the release is left, and the namespace really goes.
if [ -z "${E2E_KEEP:-}" ]; then
  t0=$SECONDS
  "$HELM" uninstall "$REL" -n "$NS" --wait --timeout 120s >/dev/null 2>&1 || fail "helm uninstall"
  left="$("$KUBECTL" get deploy,sa,svc,pdb,role,rolebinding -n "$NS" -l "app.kubernetes.io/instance=$REL" -o name 2>&1)"
  [ -z "$left" ] || fail "helm uninstall left: $left"
  "$KUBECTL" delete namespace "$NS" --timeout=120s >/dev/null 2>&1 ||
    fail "namespace $NS not gone within 120 s: $(k get pods -o wide 2>&1)"
  [ "$failures" = 0 ] && ok "helm uninstall left nothing; namespace $NS deleted, its pods stopped ($((SECONDS - t0)) s)"
fi

echo "--- $failures failure(s) in $((SECONDS - start)) s"
[ "$failures" = 0 ]
