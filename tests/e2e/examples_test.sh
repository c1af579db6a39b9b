#!/usr/bin/env bash
# e2e: every CPU strategy example trains through the operator on the developer
# control plane, with the test node agent running the pods as local processes.
#   tests/kube/with_control_plane.sh bash tests/e2e/examples_test.sh BUILD_DIR
# For each example (training shortened): `kubectl apply` -> `kubectl wait
# --for=condition=Succeeded`; status.progress filled in; the chief's final
# accuracy line in `kubectl logs` (served by the agent's kubelet endpoint);
# `kubectl get dtj` shows the printer columns; `kubectl describe dtj` the
# events; a finished job is finished: status.progress shows step N of N and
# the chief's final loss (its termination message, not the last scrape), and
# no pod of it is left Running (cleanPodPolicy defaults to Running: ps tasks
# never exit); the checkpoints are on the PersistentVolumeClaim the operator
# provisioned (served by the agent's local provisioner), kept after success;
# the ParameterServer example's Evaluator evaluates the final checkpoint.
# Then chaos: a MultiWorkerMirrored job loses a random worker to SIGKILL ten
# times; each is replaced alone and rejoins the survivors in place, and the
# job ends where the same job without faults ends (run_kill). Then one whose chief is killed with SIGKILL after a
# checkpoint: with no volume in its spec, the restarted chief resumes from
# that checkpoint (step > 0) on the provisioned claim. Then a OneDevice job
# whose worker is SIGSTOPped: the operator sees its step counter stand still,
# sets Stalled within runPolicy.progressDeadlineSeconds (+ the scrape slack),
# names the pod in an event, restarts it, and the job succeeds with Stalled
# cleared (docs/architecture.md §6b "Stalls"). The agent runs the startup and
# liveness probes the operator gives every worker, so every case also shows
# they never kill a healthy job while it starts. Then a ParameterServer job
# scaled 2 -> 4 -> 2 with kubectl scale (run_ps_scale). The namespace enforces
# the restricted Pod Security Standard. Needs root (the agent manages a block
# of /etc/hosts); skips (exit 77) otherwise. E2E_CASES="onedevice mirrored"
# runs a subset.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BUILD="$(cd "${1:?usage: examples_test.sh BUILD_DIR}" && pwd)"
: "${KUBECONFIG:?run through tests/kube/with_control_plane.sh}"
KUBECTL="${DISTRAIN_KUBE_BINDIR:?}/kubectl"
WAIT_S="${E2E_WAIT_S:-300}"
CASES="${E2E_CASES:-onedevice mirrored central-storage multi-worker-mirrored parameter-server kill chief-kill stall ps-scale}"


# shellcheck source=tests/e2e/e2e_lib.sh
. "$ROOT/tests/e2e/e2e_lib.sh"
e2e_preflight
NS="e2e-$$"
WORK="$(mktemp -d /tmp/distrain-e2e.XXXXXX)"
k() { "$KUBECTL" -n "$NS" "$@"; }
failures=0
fail() {
  echo "FAIL: $*"
  failures=$((failures + 1))
}

cleanup() {
  "$KUBECTL" delete namespace "$NS" --wait=false >/dev/null 2>&1
  e2e_stop
  if [ "$failures" != 0 ] || [ -n "${E2E_KEEP:-}" ]; then
    echo "--- logs kept in $WORK (agent.log, operator.log, logs/)"
  else
    rm -rf "$WORK"
  fi
}
trap cleanup EXIT

start=$SECONDS
"$KUBECTL" create namespace "$NS" >/dev/null || { echo "FAIL: cannot create namespace $NS"; exit 1; }
# The jobs run under the restricted Pod Security Standard: the API server
# refuses any pod the operator makes that does not meet it (the operator's
# defaults, controller/pods.h "Pod security", are what makes them pass).
"$KUBECTL" label namespace "$NS" pod-security.kubernetes.io/enforce=restricted \
  pod-security.kubernetes.io/enforce-version=latest >/dev/null ||
  { echo "FAIL: cannot label namespace $NS restricted"; exit 1; }
e2e_start_node "$WORK" "$NS" || exit 1
e2e_start_operator "$WORK/operator.log" "$NS"

# The chief: the Chief replica, else worker 0 (docs/architecture.md §3 success policy).
chief_pod() {
  if k get pod "$1-chief-0" >/dev/null 2>&1; then echo "$1-chief-0"; else echo "$1-worker-0"; fi
}

dump() {
  local job="$1"
  echo "--- $job: kubectl get dtj,pods -o wide"
  k get dtj "$job" -o yaml 2>&1 | sed -n '/^status:/,$p'
  k get pods -l "distrain.io/job-name=$job" -o wide 2>&1
  local f
  for f in "$WORK"/logs/"${NS}_${job}"-*.log; do
    [ -f "$f" ] || continue
    echo "--- $(basename "$f") (last 15 lines)"
    tail -n 15 "$f"
  done
}

# check_job NAME: the checks every example gets once it has been applied.
check_job() {
  local job="$1" t0=$SECONDS
  if ! k wait --for=condition=Succeeded "dtj/$job" --timeout="${WAIT_S}s" >/dev/null; then
    fail "$job: did not reach Succeeded within ${WAIT_S}s"
    dump "$job"
    return
  fi
  # A finished job shows the chief's final figures (its termination message,
  # recorded with the Succeeded condition), however short the job was.
  local total step loss
  total="$(k get dtj "$job" -o jsonpath='{.status.progress.totalSteps}')"
  step="$(k get dtj "$job" -o jsonpath='{.status.progress.step}')"
  loss="$(k get dtj "$job" -o jsonpath='{.status.progress.loss}')"
  [ "$total" = 150 ] || fail "$job: status.progress.totalSteps is '$total' (want 150)"
  [ "$step" = 150 ] || fail "$job: status.progress.step is '$step' (want 150 of 150)"
  [ -n "$loss" ] || fail "$job: status.progress has no final loss"
  # No pod of it keeps running or holding resources (ps tasks never exit).
  local running="" i
  for i in $(seq 1 150); do
    running="$(k get pods -l "distrain.io/job-name=$job" --field-selector=status.phase!=Succeeded,status.phase!=Failed \
      -o jsonpath='{.items[*].metadata.name}' 2>&1)"
    [ -z "$running" ] && break
    sleep 0.2
  done
  [ -z "$running" ] || fail "$job: pods still running 30 s after it succeeded: $running"
  # The checkpoints were on the claim the operator provisioned; it outlives the pods.
  local claim
  claim="$(k get pvc "$job-checkpoints" -o jsonpath='{.status.phase} {.metadata.ownerReferences[0].name}' 2>&1)"
  [ "$claim" = "Bound $job" ] || fail "$job: PVC $job-checkpoints is '$claim' (want Bound, owned by the job)"
  local chief logs
  chief="$(chief_pod "$job")"
  logs="$(k logs "$chief" 2>&1)"
  grep -Eq "training complete: .*accuracy [0-9.]+" <<<"$logs" ||
    fail "$job: no final accuracy line in 'kubectl logs $chief'; got: $(tail -n 3 <<<"$logs")"
  local tail1
  tail1="$(k logs "$chief" --tail=1 2>&1)"
  [ "$(wc -l <<<"$tail1")" = 1 ] && grep -q "$(tail -n 1 <<<"$logs" | cut -c1-40)" <<<"$tail1" ||
    fail "$job: 'kubectl logs --tail=1 $chief' is not the log's last line: $tail1"
  local get
  get="$(k get dtj "$job" 2>&1)"
  grep -Eq "^NAME +STRATEGY +STATE +WORKERS +STEP +AGE" <<<"$get" ||
    fail "$job: 'kubectl get dtj' lacks the printer columns: $get"
  grep -Eq "^$job +[A-Za-z]+ +Succeeded " <<<"$get" || fail "$job: 'kubectl get dtj' row: $get"
  local describe
  describe="$(k describe dtj "$job" 2>&1)"
  grep -Eq "^Events:" <<<"$describe" && ! grep -q "^Events: *<none>" <<<"$describe" ||
    fail "$job: 'kubectl describe dtj' shows no events"
  if [ "$job" = parameter-server ]; then
    # The Evaluator found the checkpoint directory and evaluated the last checkpoint.
    local ev="$WORK/logs/${NS}_$job-evaluator-0.log"
    grep -q "evaluated the final checkpoint (step 150)" "$ev" 2>/dev/null ||
      fail "$job: the Evaluator did not evaluate the final checkpoint; its log: $(tail -n 3 "$ev" 2>&1)"
  fi
  echo "ok: $job Succeeded at step $step/$total, loss $loss (waited $((SECONDS - t0)) s after the previous check)"
  echo "    $(grep -E 'training complete' <<<"$logs" | tail -n 1 | sed 's/^.*training complete/training complete/')"
}

run_examples() {
  local c jobs=()
  for c in $CASES; do
    [ "$c" = kill ] || [ "$c" = chief-kill ] || [ "$c" = stall ] || [ "$c" = ps-scale ] && continue
    e2e_example "$ROOT/examples/$c.yaml" 150 >"$WORK/$c.yaml"
    k apply -f "$WORK/$c.yaml" >/dev/null || { fail "$c: kubectl apply failed"; continue; }
    jobs+=("$c")
  done
  for c in "${jobs[@]}"; do check_job "$c"; done
}

# Chaos, in-place recovery (docs/architecture.md §6b): the MultiWorkerMirrored
# example (chief + 3 workers) loses a random worker to SIGKILL E2E_CHAOS_KILLS
# times (default 10), each once the group has recovered from the previous one.
# The operator replaces only the killed pod (one restart each); the chief's
# pod is never replaced and never exits; each loss costs at most the step in
# flight (the survivors resume at a step no lower than the one they had
# completed); the job Succeeds with step N of N and its final loss within 1%
# of the same job run without faults.
run_kill() {
  local job=mwms-kill clean=mwms-clean steps="${E2E_CHAOS_STEPS:-2500}" kills="${E2E_CHAOS_KILLS:-10}"
  e2e_example "$ROOT/examples/multi-worker-mirrored.yaml" "$steps" |
    sed -e "s/^  name: multi-worker-mirrored/  name: $job/" >"$WORK/$job.yaml"
  k apply -f "$WORK/$job.yaml" >/dev/null || { fail "$job: kubectl apply failed"; return; }
  local log="$WORK/logs/${NS}_$job-chief-0.log" i n
  for i in $(seq 1 600); do
    grep -Eq "step [0-9]+/$steps" "$log" 2>/dev/null && break
    sleep 0.2
  done
  grep -Eq "step [0-9]+/$steps" "$log" 2>/dev/null || { fail "$job: the chief never logged a step"; dump "$job"; return; }
  local chief_uid
  chief_uid="$(k get pod "$job-chief-0" -o jsonpath='{.metadata.uid}')"
  local -a killed_count=(0 0 0)
  local worst=0
  for n in $(seq 1 "$kills"); do
    local w=$((RANDOM % 3)) pid t0 recovered
    pid="$(cat "$WORK/pids/${NS}_$job-worker-$w.pid" 2>/dev/null)"
    if [ -z "$pid" ] || ! kill -0 "$pid" 2>/dev/null; then
      fail "$job: worker-$w has no live process before kill $n"; dump "$job"; return
    fi
    grep -q "training complete" "$log" && { fail "$job: finished after $((n - 1)) kills; raise E2E_CHAOS_STEPS"; return; }
    t0=$SECONDS
    kill -KILL "$pid"
    killed_count[$w]=$((killed_count[$w] + 1))
    # Recovered: the chief logged its n-th in-place recovery.
    for i in $(seq 1 600); do
      recovered="$(grep -c "recovered in place" "$log")"
      [ "$recovered" -ge "$n" ] && break
      sleep 0.1
    done
    if [ "$recovered" -lt "$n" ]; then
      fail "$job: the chief did not recover from kill $n (worker-$w) within 60 s"; dump "$job"; return
    fi
    [ $((SECONDS - t0)) -gt "$worst" ] && worst=$((SECONDS - t0))
    echo "kill $n: worker-$w (pid $pid); $(grep "recovered in place" "$log" | tail -n 1 | sed 's/^.*recovered/recovered/')"
  done
  if ! k wait --for=condition=Succeeded "dtj/$job" --timeout="${WAIT_S}s" >/dev/null; then
    fail "$job: did not reach Succeeded after $kills kills"
    dump "$job"
    return
  fi
  # Survivors untouched: the chief's pod is the one it started with, and each
  # worker pod was replaced exactly as often as it was killed.
  [ "$(k get pod "$job-chief-0" -o jsonpath='{.metadata.uid}')" = "$chief_uid" ] ||
    fail "$job: the chief's pod was replaced"
  local restarts
  restarts="$(k get dtj "$job" -o jsonpath='{.status.restartCount}')"
  [ "$restarts" = "$kills" ] || fail "$job: status.restartCount is '$restarts' after $kills kills (want $kills: one pod each)"
  local worker_restarts chief_restarts
  worker_restarts="$(k get dtj "$job" -o jsonpath='{.status.replicaStatuses.Worker.restarts}')"
  [ "$worker_restarts" = "$kills" ] || fail "$job: replicaStatuses.Worker.restarts '$worker_restarts' (want $kills)"
  chief_restarts="$(k get dtj "$job" -o jsonpath='{.status.replicaStatuses.Chief.restarts}')"
  [ "${chief_restarts:-0}" = 0 ] || fail "$job: the chief was restarted ($chief_restarts)"
  grep -q "exit code" "$log" && fail "$job: the chief logged an exit: $(grep 'exit code' "$log" | head -n 1)"
  # At most the step in flight lost: nobody resumed behind what it had completed.
  local back
  back="$(grep -Eo "resuming at step [0-9]+ \(this process had completed [0-9]+\)" "$log" |
    awk '{ if ($4 < $9 + 0) print }' | head -n 1)"
  [ -z "$back" ] || fail "$job: the chief went back: $back"
  local step loss
  step="$(k get dtj "$job" -o jsonpath='{.status.progress.step}')"
  loss="$(k get dtj "$job" -o jsonpath='{.status.progress.loss}')"
  [ "$step" = "$steps" ] || fail "$job: status.progress.step is '$step' (want $steps)"
  echo "ok: $job Succeeded after $kills worker kills (${killed_count[*]} per worker), slowest recovery ${worst}s; loss $loss"
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
    echo "ok: final loss $loss after the kills, $clean_loss without (within 1%)"
  else
    fail "$job: final loss $loss after the kills vs $clean_loss without faults (want within 1%)"
  fi
}

# The chief SIGKILLed after a checkpoint (no SIGTERM, so no checkpoint of its
# own at exit), with no volume in the spec: the restarted chief resumes from
# the last checkpoint on the claim the operator provisioned.
run_chief_kill() {
  local job=mwms-chief-kill
  e2e_example "$ROOT/examples/multi-worker-mirrored.yaml" 600 |
    sed -E -e "s/^  name: multi-worker-mirrored/  name: $job/" -e 's/^(      everySteps:) [0-9]+/\1 50/' >"$WORK/$job.yaml"
  grep -q "volume:" "$WORK/$job.yaml" && { fail "$job: the example names a volume; this case needs none"; return; }
  k apply -f "$WORK/$job.yaml" >/dev/null || { fail "$job: kubectl apply failed"; return; }
  local log="$WORK/logs/${NS}_$job-chief-0.log" pidfile="$WORK/pids/${NS}_$job-chief-0.pid" i saved=""
  for i in $(seq 1 900); do
    saved="$(grep -Eo "checkpoint step [0-9]+ written" "$log" 2>/dev/null | tail -n 1 | grep -Eo "[0-9]+")"
    [ -n "$saved" ] && break
    sleep 0.2
  done
  [ -n "$saved" ] || { fail "$job: the chief never wrote a checkpoint"; dump "$job"; return; }
  local pid
  pid="$(cat "$pidfile" 2>/dev/null)"
  [ -n "$pid" ] || { fail "$job: no pid file $pidfile"; dump "$job"; return; }
  kill -KILL "$pid"
  echo "killed $job-chief-0 (pid $pid) after its checkpoint at step $saved"
  local resumed=""
  for i in $(seq 1 900); do
    resumed="$(grep -Eo "resumed from checkpoint step [0-9]+" "$log" 2>/dev/null | grep -Eo "[0-9]+" | tail -n 1)"
    [ -n "$resumed" ] && break
    sleep 0.2
  done
  if [ -n "$resumed" ] && [ "$resumed" -ge "$saved" ] 2>/dev/null && [ "$resumed" -gt 0 ]; then
    echo "ok: $job's restarted chief resumed from checkpoint step $resumed"
  else
    fail "$job: the restarted chief did not resume from a checkpoint at step >= $saved (got '${resumed}')"
    dump "$job"
    return
  fi
  if ! k wait --for=condition=Succeeded "dtj/$job" --timeout="${WAIT_S}s" >/dev/null; then
    fail "$job: did not reach Succeeded after the chief was killed"
    dump "$job"
    return
  fi
  local restarts
  restarts="$(k get dtj "$job" -o jsonpath='{.status.restartCount}')"
  [ "${restarts:-0}" -ge 1 ] 2>/dev/null || fail "$job: status.restartCount is '$restarts' (want >= 1)"
  echo "ok: $job Succeeded after the chief was killed; restartCount $restarts"
}

# ParameterServer scaled in place (docs/architecture.md §6b, worker/strategy/
# ps_membership.h): the example, elastic within [2, 4], is scaled 2 -> 4 with
# `kubectl scale` while it trains. The pods the scale adds join the chief's
# worker set and complete closures (the chief's per-worker counter
# distrain_ps_worker_closures_completed_total, read from its pod, and its
# final per-worker line). Then 4 -> 2: the operator deletes the two added
# pods (SIGTERM: they leave the set first), and the job Succeeds with every
# requested step done, each counted once; the chief's pod is never replaced.
run_ps_scale() {
  local job=ps-scale steps=8000
  e2e_example "$ROOT/examples/parameter-server.yaml" "$steps" |
    sed -E -e "s/^  name: parameter-server/  name: $job/" -e 's/^(      everySteps:) [0-9]+/\1 2000/' \
      -e "s/^(  strategy: ParameterServer)\$/\1\n  elasticPolicy: {minReplicas: 2, maxReplicas: 4}/" >"$WORK/$job.yaml"
  grep -q "maxReplicas: 4" "$WORK/$job.yaml" || { fail "$job: could not write the job: $(cat "$WORK/$job.yaml")"; return; }
  k apply -f "$WORK/$job.yaml" >/dev/null || { fail "$job: kubectl apply failed"; return; }
  local log="$WORK/logs/${NS}_$job-chief-0.log" i
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
    echo "ok: $job scaled 2 -> 4: worker:2 and worker:3 completed $w2 and $w3 closures $((SECONDS - scaled)) s after kubectl scale"
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
  local done_line per_worker
  done_line="$(grep -Eo "[0-9]+ closure\(s\) completed, [0-9]+ retried" "$log" | tail -n 1)"
  per_worker="$(grep -Eo "closures per worker: .*" "$log" | tail -n 1)"
  [ "${done_line%% *}" = "$steps" ] || fail "$job: '$done_line' (want $steps closures completed, each once)"
  grep -Eq "worker:2 [1-9][0-9]*, worker:3 [1-9][0-9]*" <<<"$per_worker" ||
    fail "$job: the added workers ran no closure by the chief's count: $per_worker"
  [ "$(k get pod "$job-chief-0" -o jsonpath='{.metadata.uid}' 2>/dev/null)" = "$chief_uid" ] ||
    [ -z "$(k get pod "$job-chief-0" -o name 2>/dev/null)" ] ||
    fail "$job: the chief's pod was replaced by the scale"
  echo "ok: $job Succeeded after 2 -> 4 -> 2: $done_line; $per_worker"
}

# A OneDevice worker SIGSTOPped mid-training: a process that hangs outside any
# collective never exits, so only its progress shows it. Deadline 10 s; the
# operator's judgement adds 10 s for its 5 s scrapes (controller/stall.h), so
# Stalled must come within 40 s of the stop. The pod's grace period is short
# because a stopped process cannot act on its SIGTERM: the agent's SIGKILL
# after the grace period is what ends it, as a kubelet's would. The template's
# own livenessProbe (tcpSocket, which a stopped process's listening socket
# still accepts) replaces the operator's /healthz one, so the kubelet's kill
# (about 30 s) cannot race the operator's Stalled restart (about 20 s).
run_stall() {
  local job=onedevice-stall deadline=10
  e2e_example "$ROOT/examples/onedevice.yaml" 20000 |
    sed -E -e "s/^  name: onedevice/  name: $job/" -e 's/^(      everySteps:) [0-9]+/\1 2000/' \
      -e "s/^(      replicas: 1)\$/\1\n      template: {spec: {terminationGracePeriodSeconds: 2, containers: [{name: distrain, command: [distrain-worker], livenessProbe: {tcpSocket: {port: metrics}}}]}}/" \
      -e "s/^(  training:)\$/  runPolicy: {progressDeadlineSeconds: $deadline}\n\1/" >"$WORK/$job.yaml"
  grep -q "progressDeadlineSeconds: $deadline" "$WORK/$job.yaml" &&
    grep -q "terminationGracePeriodSeconds: 2" "$WORK/$job.yaml" ||
    { fail "$job: could not write the job: $(cat "$WORK/$job.yaml")"; return; }
  k apply -f "$WORK/$job.yaml" >/dev/null || { fail "$job: kubectl apply failed"; return; }
  local log="$WORK/logs/${NS}_$job-worker-0.log" pidfile="$WORK/pids/${NS}_$job-worker-0.pid" i
  # Stop it once the operator has seen it step after it started (lastStepTime
  # later than the container's startedAt; both have whole seconds, and within
  # the same second the operator reads the start-up allowance, not the
  # deadline), so the stall is judged against the deadline.
  local seen="" started=""
  for i in $(seq 1 600); do
    seen="$(k get dtj "$job" -o jsonpath='{.status.progress.lastStepTime}' 2>/dev/null)"
    started="$(k get pod "$job-worker-0" -o jsonpath='{.status.containerStatuses[0].state.running.startedAt}' 2>/dev/null)"
    [ -n "$seen" ] && [ -n "$started" ] && [[ "$seen" > "$started" ]] && break
    sleep 0.2
  done
  [ -n "$seen" ] && [[ "$seen" > "$started" ]] ||
    { fail "$job: status.progress.lastStepTime ('$seen') never passed the start ('$started') while it trained"; dump "$job"; return; }
  local pid uid
  pid="$(cat "$pidfile" 2>/dev/null)"
  uid="$(k get pod "$job-worker-0" -o jsonpath='{.metadata.uid}')"
  [ -n "$pid" ] || { fail "$job: no pid file $pidfile"; dump "$job"; return; }
  kill -STOP "$pid"
  local stopped_at=$SECONDS
  echo "stopped $job-worker-0 (pid $pid) after: $(grep -E 'step [0-9]+/20000' "$log" | tail -n 1 | sed 's/^.*step/step/')"
  local stalled=""
  for i in $(seq 1 250); do
    stalled="$(k get dtj "$job" -o jsonpath='{.status.conditions[?(@.type=="Stalled")].status}')"
    [ "$stalled" = True ] && break
    sleep 0.2
  done
  if [ "$stalled" = True ] && [ $((SECONDS - stopped_at)) -le 40 ]; then
    echo "ok: $job Stalled $((SECONDS - stopped_at)) s after the stop: $(k get dtj "$job" -o jsonpath='{.status.conditions[?(@.type=="Stalled")].message}')"
  else
    fail "$job: Stalled is '$stalled' $((SECONDS - stopped_at)) s after the stop (want True within 40 s)"
    kill -CONT "$pid" 2>/dev/null
    dump "$job"
    return
  fi
  k describe dtj "$job" | grep -Eq "ProgressDeadlineExceeded.*pod $job-worker-0" ||
    fail "$job: no ProgressDeadlineExceeded event naming pod $job-worker-0"
  # The pod is replaced: a new uid under the same name.
  local new_uid=""
  for i in $(seq 1 300); do
    new_uid="$(k get pod "$job-worker-0" -o jsonpath='{.metadata.uid}' 2>/dev/null)"
    [ -n "$new_uid" ] && [ "$new_uid" != "$uid" ] && break
    sleep 0.2
  done
  [ -n "$new_uid" ] && [ "$new_uid" != "$uid" ] || fail "$job: pod $job-worker-0 was not replaced"
  if ! k wait --for=condition=Succeeded "dtj/$job" --timeout="${WAIT_S}s" >/dev/null; then
    fail "$job: did not reach Succeeded after the stall"
    dump "$job"
    return
  fi
  local restarts still
  restarts="$(k get dtj "$job" -o jsonpath='{.status.restartCount}')"
  still="$(k get dtj "$job" -o jsonpath='{.status.conditions[?(@.type=="Stalled")].status}')"
  [ "${restarts:-0}" -ge 1 ] 2>/dev/null || fail "$job: status.restartCount is '$restarts' (want >= 1)"
  [ "$still" = False ] || fail "$job: Stalled is '$still' after success (want False)"
  echo "ok: $job Succeeded after the stall; restartCount $restarts, Stalled $still"
}

run_examples
[[ " $CASES " == *" kill "* ]] && run_kill
[[ " $CASES " == *" chief-kill "* ]] && run_chief_kill
[[ " $CASES " == *" stall "* ]] && run_stall
[[ " $CASES " == *" ps-scale "* ]] && run_ps_scale

echo "e2e examples: $failures failure(s) in $((SECONDS - start)) s"
[ "$failures" = 0 ]
