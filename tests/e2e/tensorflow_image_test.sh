#!/usr/bin/env bash
# e2e: a user's own TensorFlow image trains through the operator on the real
# node (scripts/node.sh), nothing of distrain in its pods but TF_CONFIG.
#   tests/e2e/with_node.sh bash tests/e2e/tensorflow_image_test.sh BUILD_DIR
# Checks, each printed as it passes, with its time:
#   1. scripts/build-tf-image.sh --import: the example image (Debian 12 base,
#      python3, tensorflow-cpu + tf-keras, examples/tensorflow/*.py; cached by
#      version as an OCI archive, so warm this only imports it) in the node's
#      containerd;
#   2. the operator from the chart (one replica, the images of BUILD via
#      scripts/node.sh load-images) watching a namespace that enforces the
#      restricted Pod Security Standard;
#   3. examples/tensorflow-multi-worker-mirrored.yaml as written but for the
#      image's exact tag: Succeeded; both workers' logs say TensorFlow formed a
#      collective group of 2 replicas in sync from the operator's TF_CONFIG;
#      worker 0's loss decreased, it saved the model on the job's claim and
#      its final step and loss (its termination message) are in status.progress;
#   4. examples/tensorflow-parameter-server.yaml likewise: Succeeded; TensorFlow's
#      ps and worker servers served on the TF_CONFIG names; the chief connected
#      to 2 workers and 1 ps, its variables live on the ps task, its loss
#      decreased and is in status.progress; the servers (which never exit on
#      their own) are deleted after the success and no pod of the job is left
#      running;
#   and no job was ever Stalled (the operator scrapes no metrics from TF pods).
# E2E_CASES="mwms ps" runs a subset; E2E_KEEP=1 keeps the namespace;
# E2E_WAIT_S bounds each job (default 300).
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BUILD="$(cd "${1:?usage: tensorflow_image_test.sh BUILD_DIR}" && pwd)"
: "${KUBECONFIG:?run through tests/e2e/with_node.sh}"
KUBECTL="${DISTRAIN_KUBE_BINDIR:?run through tests/e2e/with_node.sh}/kubectl"
NODE_SH="${DISTRAIN_NODE_SH:-$ROOT/scripts/node.sh}"
CP="${DISTRAIN_CONTROL_PLANE:-$ROOT/scripts/control-plane.sh}"
WAIT_S="${E2E_WAIT_S:-300}"
CASES="${E2E_CASES:-mwms ps}"
# shellcheck source=tests/e2e/e2e_lib.sh
. "$ROOT/tests/e2e/e2e_lib.sh"
e2e_preflight
HELM="$("$CP" helmbin 2>/dev/null)" || { echo "FAIL: no helm (scripts/control-plane.sh build builds it)"; exit 1; }

NS="tf-e2e-$$"
REL="tf$$"
WORK="$(mktemp -d /tmp/distrain-e2e-tf.XXXXXX)"
dump() {
  echo "--- kubectl get dtj,pods -o wide"
  k get dtj,pods -o wide 2>&1
  k get events --sort-by=.lastTimestamp 2>&1 | tail -n 20
  local f
  for f in "$WORK"/*.log; do
    [[ "$(basename "$f")" == "$1"* ]] || continue
    echo "--- $(basename "$f" .log) (last 10 lines)"
    tail -n 10 "$f"
  done
}
cleanup() {
  local p
  for p in $(jobs -p); do kill "$p" 2>/dev/null; done
  if [ -z "${E2E_KEEP:-}" ]; then
    "$HELM" uninstall "$REL" -n "$NS" >/dev/null 2>&1
    "$KUBECTL" delete namespace "$NS" --wait=false >/dev/null 2>&1
  fi
  if [ "$failures" = 0 ] && [ -z "${E2E_KEEP:-}" ]; then rm -rf "$WORK"; else echo "--- files kept in $WORK"; fi
}
trap cleanup EXIT
start=$SECONDS

# 1. The image, built once per version and recipe (a cold build downloads the
# wheels and takes minutes; warm, the cached archive is only imported).
t0=$SECONDS
out="$("$ROOT/scripts/build-tf-image.sh" --import 2>"$WORK/build-tf-image.log")" ||
  { cat "$WORK/build-tf-image.log"; fail "scripts/build-tf-image.sh --import"; exit 1; }
read -r IMAGE ARCHIVE <<<"$out"
"$NODE_SH" ctr images ls -q | grep -qx "$IMAGE" || { fail "containerd lacks $IMAGE after the import"; exit 1; }
ok "image $IMAGE ($(du -h "$ARCHIVE" | cut -f1) archive) in the node's containerd ($((SECONDS - t0)) s: $(grep -Eo 'cached|built in [0-9]+ s|imported into [^(]*in [0-9]+ s|already in the node' "$WORK/build-tf-image.log" | paste -sd, -))"

# 2. The operator, as a user installs it.
t0=$SECONDS
e2e_load_images 2>"$WORK/load-images.log" ||
  { cat "$WORK/load-images.log"; fail "scripts/node.sh load-images --build-dir $BUILD --tag $E2E_TAG"; exit 1; }
e2e_namespace "$NS" || { fail "cannot create namespace $NS enforcing the restricted Pod Security Standard"; exit 1; }
if ! e2e_helm_install "$REL" "$NS" --set replicaCount=1 --set podDisruptionBudget.enabled=false \
    --wait --timeout 180s >"$WORK/install.log" 2>&1; then
  cat "$WORK/install.log"
  fail "helm install (the operator Deployment not ready within 180 s)"
  dump operator
  exit 1
fi
ok "operator installed from the chart into $NS ($((SECONDS - t0)) s)"

# run_job EXAMPLE PODS...: applies examples/EXAMPLE.yaml with the image's exact
# tag, follows PODS' logs, waits for Succeeded or Failed; sets ELAPSED.
run_job() {
  local example="$1" job pod i state="" n
  shift
  job="$example"
  sed "s#localhost/distrain/tensorflow-example:2.21.0#$IMAGE#" "$ROOT/examples/$example.yaml" >"$WORK/$example.yaml"
  n="$(grep -c "image: $IMAGE\$" "$WORK/$example.yaml")"
  [ "$n" -ge 1 ] || { fail "$job: could not set the image in examples/$example.yaml"; return 1; }
  local t0=$SECONDS
  k apply -f "$WORK/$example.yaml" >/dev/null || { fail "$job: kubectl apply failed"; return 1; }
  # Pods still running when the job succeeds are deleted (cleanPodPolicy
  # Running), their logs with them: every pod is followed from its start.
  for pod in "$@"; do e2e_follow_log "$NS" "$job-$pod" "$WORK/$job-$pod.log" </dev/null >/dev/null 2>&1 & done
  for i in $(seq 1 $((WAIT_S * 2))); do
    state="$(k get dtj "$job" -o jsonpath='{.status.state}' 2>/dev/null)"
    [ "$state" = Succeeded ] || [ "$state" = Failed ] && break
    sleep 0.5
  done
  ELAPSED=$((SECONDS - t0))
  if [ "$state" != Succeeded ]; then
    fail "$job: state '$state' after ${ELAPSED} s (want Succeeded)"
    k describe dtj "$job" 2>&1 | sed -n '/^Status:/,$p' | tail -n 30
    dump "$job"
    return 1
  fi
  # The pods still running at the success are deleted; their logs end then.
  for i in $(seq 1 100); do
    [ -z "$(jobs -rp)" ] && break
    sleep 0.2
  done
  local stalled
  stalled="$(k get dtj "$job" -o jsonpath='{.status.conditions[?(@.type=="Stalled")].status}')"
  [ -z "$stalled" ] || [ "$stalled" = False ] || fail "$job: Stalled is '$stalled'"
  return 0
}

# No pod of JOB left running (ps and worker servers never exit on their own).
check_cleaned_up() {
  local job="$1" t0=$SECONDS running="" i
  for i in $(seq 1 150); do
    running="$(k get pods -l "distrain.io/job-name=$job" --field-selector=status.phase!=Succeeded,status.phase!=Failed \
      -o jsonpath='{.items[*].metadata.name}' 2>&1)"
    [ -z "$running" ] && break
    sleep 0.2
  done
  if [ -z "$running" ]; then
    echo "    no pod of $job left running $((SECONDS - t0)) s after it succeeded"
  else
    fail "$job: pods still running 30 s after it succeeded: $running"
  fi
}

# check_final JOB LOG: status.progress holds the chief's final figures (its
# termination message): step 60 of 60 (spec.training.steps) and the loss its
# log printed last.
check_final() {
  local job="$1" log="$2" got want
  got="$(k get dtj "$job" -o jsonpath='{.status.progress.step}/{.status.progress.totalSteps} {.status.progress.loss}')"
  want="$(grep -Eo 'last epoch [0-9.]+' "$log" | tail -n 1 | awk '{print $3}')"
  if [[ "$got" =~ ^60/60\ ([0-9.]+)$ ]] && [ -n "$want" ] &&
      awk -v a="${BASH_REMATCH[1]}" -v b="$want" 'BEGIN { d = a - b; exit !(d < 1e-3 && d > -1e-3) }'; then
    echo "    status.progress: step $got (the chief's termination message)"
  else
    fail "$job: status.progress is '$got' (want 60/60 and the loss $want the chief logged last)"
  fi
}

# expect FILE REGEX WHAT
expect() {
  grep -Eq "$2" "$1" 2>/dev/null || fail "$3: no line matching '$2' in $(basename "$1" .log)'s log; its last lines: $(tail -n 5 "$1" 2>&1)"
}

# 3. MultiWorkerMirrored: TensorFlow's collective group of the 2 workers.
if [[ " $CASES " == *" mwms "* ]]; then
  job=tensorflow-multi-worker-mirrored
  if run_job "$job" worker-0 worker-1; then
    for w in 0 1; do
      expect "$WORK/$job-worker-$w.log" "^tf-mwms: task worker $w of 2, replicas in sync 2\$" "$job worker $w"
    done
    expect "$WORK/$job-worker-0.log" '^tf-mwms: loss first epoch [0-9.]+ last epoch [0-9.]+ \(decreased\)$' "$job"
    expect "$WORK/$job-worker-0.log" '^tf-mwms: saved model to /var/lib/distrain/checkpoints/model/model.keras$' "$job"
    [ "$(k get pod "$job-worker-0" -o jsonpath='{.spec.containers[0].image}')" = "$IMAGE" ] ||
      fail "$job: worker-0 does not run $IMAGE"
    check_final "$job" "$WORK/$job-worker-0.log"
    check_cleaned_up "$job"
    ok "$job Succeeded ${ELAPSED} s after kubectl apply: a group of 2 replicas in sync; $(grep -Eo 'loss first.*' "$WORK/$job-worker-0.log")"
    echo "    $(grep -E '^tf-mwms: trained' "$WORK/$job-worker-0.log")"
  fi
fi

# 4. ParameterServer: TensorFlow's ps and worker servers, a chief coordinator.
if [[ " $CASES " == *" ps "* ]]; then
  job=tensorflow-parameter-server
  if run_job "$job" chief-0 worker-0 worker-1 ps-0; then
    for t in worker-0 worker-1 ps-0; do
      expect "$WORK/$job-$t.log" "^tf-ps: ${t%-*} ${t##*-} serving at $job-$t\\.$NS\\.svc:2222 " "$job $t"
    done
    expect "$WORK/$job-chief-0.log" "\"ps\": \\[\"$job-ps-0\\.$NS\\.svc:2222\"\\]" "$job chief's TF_CONFIG"
    expect "$WORK/$job-chief-0.log" '^tf-ps: connected to 2 workers and 1 ps' "$job"
    expect "$WORK/$job-chief-0.log" '^tf-ps: chief: 2 workers, 1 ps; variables on /job:ps/replica:0/task:0/device:CPU:0 \([0-9]+\)$' "$job"
    expect "$WORK/$job-chief-0.log" '^tf-ps: loss first epoch [0-9.]+ last epoch [0-9.]+ \(decreased\)$' "$job"
    expect "$WORK/$job-chief-0.log" '^tf-ps: saved model to /var/lib/distrain/checkpoints/model/model.keras$' "$job"
    check_final "$job" "$WORK/$job-chief-0.log"
    check_cleaned_up "$job"
    ok "$job Succeeded ${ELAPSED} s after kubectl apply: variables on the ps task, trained by 2 workers; $(grep -Eo 'loss first.*' "$WORK/$job-chief-0.log")"
    echo "    $(grep -E '^tf-ps: trained' "$WORK/$job-chief-0.log")"
  fi
fi

echo "--- $failures failure(s) in $((SECONDS - start)) s"
[ "$failures" = 0 ]
