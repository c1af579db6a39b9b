#!/usr/bin/env bash
# e2e: every CPU strategy example trains through the operator on the developer
# control plane, with the test node agent running the pods as local processes.
#   tests/kube/with_control_plane.sh bash tests/e2e/examples_test.sh BUILD_DIR
# For each example (training shortened): `kubectl apply` -> `kubectl wait
# --for=condition=Succeeded`; status.progress filled in; the chief's final
# accuracy line in `kubectl logs` (served by the agent's kubelet endpoint);
# `kubectl get dtj` shows the printer columns; `kubectl describe dtj` the
# events. Then a MultiWorkerMirrored job whose worker is killed with SIGKILL:
# the restart shows in status.restartCount and a Restarting event, and the job
# still succeeds. The namespace enforces the restricted Pod Security
# Standard. Needs root (the agent manages a block of /etc/hosts); skips
# (exit 77) otherwise. E2E_CASES="onedevice mirrored" runs a subset.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BUILD="$(cd "${1:?usage: examples_test.sh BUILD_DIR}" && pwd)"
: "${KUBECONFIG:?run through tests/kube/with_control_plane.sh}"
KUBECTL="${DISTRAIN_KUBE_BINDIR:?}/kubectl"
WAIT_S="${E2E_WAIT_S:-300}"
CASES="${E2E_CASES:-onedevice mirrored central-storage multi-worker-mirrored parameter-server kill}"


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
  # status.progress.step is scraped from the running chief every 5 s, so a
  # job this short may finish unseen; run_kill checks it on a longer job.
  local total
  total="$(k get dtj "$job" -o jsonpath='{.status.progress.totalSteps}')"
  [ "$total" = 150 ] || fail "$job: status.progress.totalSteps is '$total' (want 150)"
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
  echo "ok: $job Succeeded (waited $((SECONDS - t0)) s after the previous check)"
  echo "    $(grep -E 'training complete' <<<"$logs" | tail -n 1 | sed 's/^.*training complete/training complete/')"
}

run_examples() {
  local c jobs=()
  for c in $CASES; do
    [ "$c" = kill ] && continue
    e2e_example "$ROOT/examples/$c.yaml" 150 >"$WORK/$c.yaml"
    k apply -f "$WORK/$c.yaml" >/dev/null || { fail "$c: kubectl apply failed"; continue; }
    jobs+=("$c")
  done
  for c in "${jobs[@]}"; do check_job "$c"; done
}

# A SIGKILL'd worker (exit 137, retryable under restartPolicy ExitCode) is
# replaced; the job goes on and succeeds.
run_kill() {
  local job=mwms-kill
  e2e_example "$ROOT/examples/multi-worker-mirrored.yaml" 400 |
    sed -e "s/^  name: multi-worker-mirrored/  name: $job/" >"$WORK/$job.yaml"
  k apply -f "$WORK/$job.yaml" >/dev/null || { fail "$job: kubectl apply failed"; return; }
  local log="$WORK/logs/${NS}_$job-chief-0.log" pidfile="$WORK/pids/${NS}_$job-worker-1.pid" i
  for i in $(seq 1 600); do
    grep -Eq "step [0-9]+/400" "$log" 2>/dev/null && break
    sleep 0.2
  done
  grep -Eq "step [0-9]+/400" "$log" 2>/dev/null || { fail "$job: the chief never logged a step"; dump "$job"; return; }
  local pid
  pid="$(cat "$pidfile" 2>/dev/null)"
  [ -n "$pid" ] || { fail "$job: no pid file $pidfile"; dump "$job"; return; }
  kill -KILL "$pid"
  echo "killed $job-worker-1 (pid $pid) after: $(grep -E 'step [0-9]+/400' "$log" | tail -n 1 | sed 's/^.*step/step/')"
  for i in $(seq 1 300); do
    [ "$(k get dtj "$job" -o jsonpath='{.status.restartCount}')" -ge 1 ] 2>/dev/null && break
    sleep 0.2
  done
  # status.progress fills in from the running chief (the operator scrapes it
  # every 5 s); the restarted job runs long enough to be seen.
  local step=""
  for i in $(seq 1 300); do
    step="$(k get dtj "$job" -o jsonpath='{.status.progress.step}')"
    [ -n "$step" ] && [ "$step" -gt 0 ] 2>/dev/null && break
    sleep 0.2
  done
  if [ -n "$step" ] && [ "$step" -gt 0 ] 2>/dev/null; then
    echo "ok: $job status.progress.step $step while running"
  else
    fail "$job: status.progress.step never filled in while running"
  fi
  local restarts
  restarts="$(k get dtj "$job" -o jsonpath='{.status.restartCount}')"
  [ "${restarts:-0}" -ge 1 ] 2>/dev/null || fail "$job: status.restartCount is '$restarts' after the kill (want >= 1)"
  if ! k wait --for=condition=Succeeded "dtj/$job" --timeout="${WAIT_S}s" >/dev/null; then
    fail "$job: did not reach Succeeded after the kill"
    dump "$job"
    return
  fi
  # The event names the first failed pod the operator saw: worker-1, or a
  # peer that exited 170 (peer lost) a moment earlier.
  k describe dtj "$job" | grep -Eq "Restarting .*$job-(worker|chief)-[0-9]" ||
    fail "$job: 'kubectl describe dtj' shows no Restarting event naming a pod of $job"
  echo "ok: $job Succeeded after the kill; restartCount $(k get dtj "$job" -o jsonpath='{.status.restartCount}')"
}

run_examples
[[ " $CASES " == *" kill "* ]] && run_kill

echo "e2e examples: $failures failure(s) in $((SECONDS - start)) s"
[ "$failures" = 0 ]
