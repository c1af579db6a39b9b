#!/usr/bin/env bash
# Kube tier: the DistributedTrainingJob CRD against a real kube-apiserver.
#
# Checks, each printed as it runs:
#   1. crds/ applies without warnings and the CRD becomes Established;
#   2. every examples/*.yaml and tests/kube/valid/*.yaml passes server-side
#      dry-run (schema, defaults, CEL; strict: an unknown field is an error);
#   3. every tests/kube/invalid/*.yaml is rejected at apply time, and the error
#      contains each of the file's `# expect: <substring>` lines;
#   4. the examples apply for real and the API server fills in the schema defaults;
#   5. `kubectl get dtj` prints the Strategy, State, Workers, Step and Age columns;
#   6. the short name dtj and the category distrain list the jobs;
#   7. the scale subresource: `kubectl scale` sets spec.replicaSpecs.Worker.replicas,
#      /scale reports it with the status selector, and CEL still refuses a scale
#      that breaks a cross-field rule.
#
# Uses the control plane of scripts/control-plane.sh: reuses it when it is up,
# else starts it and stops it again at exit. Jobs live in a namespace of their own,
# deleted at exit. Run from anywhere; exits non-zero on the first failed check
# with a message saying what differed.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
CP=scripts/control-plane.sh
NS="distrain-crd-test-$$"
CRD=distributedtrainingjobs.distrain.io
started_cluster=0
checks=0

say() { printf '[crd-test] %s\n' "$*"; }
fail() {
  printf '[crd-test] FAIL: %s\n' "$*" >&2
  exit 1
}
pass() {
  checks=$((checks + 1))
  printf '[crd-test]   ok: %s\n' "$*"
}

cleanup() {
  local rc=$?
  if [ -n "${KUBECTL:-}" ]; then
    "$KUBECTL" delete namespace "$NS" --ignore-not-found --wait=false >/dev/null 2>&1 || true
  fi
  if [ "$started_cluster" = 1 ]; then
    say "stopping the control plane this test started"
    "$CP" down >/dev/null 2>&1 || true
  fi
  exit $rc
}
trap cleanup EXIT

if "$CP" status >/dev/null 2>&1; then
  say "reusing the running control plane ($("$CP" kubeconfig))"
else
  say "starting the control plane (scripts/control-plane.sh up)"
  started_cluster=1
  "$CP" up >/dev/null || fail "scripts/control-plane.sh up failed (its messages are above)"
fi
KUBECTL="$("$CP" bindir)/kubectl"
export KUBECONFIG
KUBECONFIG="$("$CP" kubeconfig)"
k() { "$KUBECTL" "$@"; }
say "kube-apiserver $(k version -o json | python3 -c 'import json,sys; print(json.load(sys.stdin)["serverVersion"]["gitVersion"])')"

# --- 1. The CRD ---------------------------------------------------------------
say "1. apply crds/ and wait for the CRD to be established"
out="$(k apply -f crds/ 2>&1)" || fail "kubectl apply -f crds/ was refused:
$out"
if grep -qi 'warning' <<<"$out"; then
  fail "the API server warned about the CRD (fix crds/ and its chart copy):
$out"
fi
pass "applied: $out"
# kubectl wait gives up at once ("accessor error") when it reads the CRD before the
# API server has written any condition, so retry it until the deadline.
deadline=$((SECONDS + 60))
until k wait --for condition=established --timeout=10s "crd/$CRD" >/dev/null 2>&1; do
  [ $SECONDS -lt $deadline ] ||
    fail "CRD $CRD not Established within 60 s: $(k get "crd/$CRD" -o jsonpath='{.status.conditions}')"
  sleep 0.5
done
names_accepted="$(k get "crd/$CRD" -o jsonpath='{.status.conditions[?(@.type=="NamesAccepted")].status}')"
[ "$names_accepted" = True ] || fail "CRD names not accepted: $(k get "crd/$CRD" -o jsonpath='{.status.conditions}')"
k create namespace "$NS" >/dev/null || fail "could not create namespace $NS"
# Established means served; discovery (what kubectl resolves kinds with) follows shortly.
deadline=$((SECONDS + 30))
until k get dtj -n "$NS" >/dev/null 2>&1; do
  [ $SECONDS -lt $deadline ] || fail "the API server never served dtj in discovery: $(k get dtj -n "$NS" 2>&1)"
  sleep 0.5
done
pass "CRD established, names accepted, served in discovery"

# --- 2. Every example passes server-side validation ---------------------------
say "2. server-side dry-run of every examples/*.yaml and tests/kube/valid/*.yaml"
examples=(examples/*.yaml)
[ ${#examples[@]} -gt 0 ] && [ -f "${examples[0]}" ] || fail "no examples/*.yaml found"
for f in "${examples[@]}" tests/kube/valid/*.yaml; do
  out="$(k apply --dry-run=server -n "$NS" -f "$f" 2>&1)" || fail "$f was rejected by the API server:
$out"
  pass "$f: $out"
done

# --- 3. Every invalid spec is rejected with its message -----------------------
say "3. apply every tests/kube/invalid/*.yaml; each must be rejected with its '# expect:' text"
invalid=(tests/kube/invalid/*.yaml)
[ ${#invalid[@]} -ge 10 ] || fail "tests/kube/invalid holds ${#invalid[@]} specs; the tier requires at least 10"
for f in "${invalid[@]}"; do
  mapfile -t expects < <(sed -n 's/^# expect: //p' "$f")
  [ ${#expects[@]} -gt 0 ] || fail "$f has no '# expect: <substring>' line"
  if out="$(k apply -n "$NS" -f "$f" 2>&1)"; then
    fail "$f was accepted, but it breaks a rule (expected an error containing '${expects[0]}'):
$out"
  fi
  for e in "${expects[@]}"; do
    grep -qF -- "$e" <<<"$out" || fail "$f was rejected, but without '$e'. The API server said:
$out"
  done
  pass "$f rejected: $(grep -F -- "${expects[0]}" <<<"$out" | head -n1 | cut -c1-400)"
done
leftovers="$(k get dtj -n "$NS" -o name 2>&1)"
[ -z "$leftovers" ] || fail "rejected specs left objects behind: $leftovers"

# --- 4. The examples apply for real, with the schema's defaults ---------------
say "4. apply every example for real and read back the server's defaults"
for f in "${examples[@]}"; do
  out="$(k apply -n "$NS" -f "$f" 2>&1)" || fail "kubectl apply -f $f failed:
$out"
done
n="$(k get distributedtrainingjobs -n "$NS" -o name | wc -l)"
[ "$n" = "${#examples[@]}" ] || fail "expected ${#examples[@]} jobs after applying the examples, found $n"
pass "${#examples[@]} jobs created"
expect_field() {
  local job="$1" path="$2" want="$3" got
  got="$(k get dtj "$job" -n "$NS" -o jsonpath="{$path}")"
  [ "$got" = "$want" ] || fail "dtj/$job $path: the API server defaulted it to '$got', the CRD says '$want'"
  pass "dtj/$job $path = $want (defaulted)"
}
expect_field onedevice .spec.replicaSpecs.Worker.restartPolicy ExitCode
expect_field onedevice .spec.successPolicy Default
expect_field onedevice .spec.runPolicy.cleanPodPolicy Running
expect_field onedevice .spec.runPolicy.suspend false
expect_field onedevice .spec.training.optimizer.epsilon 1e-07
expect_field onedevice .spec.training.dataset.autoShardPolicy AUTO
expect_field onedevice .spec.training.communication.bytesPerPack 4194304
expect_field parameter-server .spec.replicaSpecs.PS.restartPolicy ExitCode

# --- 5. Printer columns ------------------------------------------------------
say "5. kubectl get dtj shows the printer columns"
table="$(k get dtj -n "$NS" 2>&1)" || fail "kubectl get dtj failed: $table"
printf '%s\n' "$table" | sed 's/^/[crd-test]      /'
header="$(head -n1 <<<"$table" | tr -s ' ')"
[ "$header" = "NAME STRATEGY STATE WORKERS STEP AGE" ] ||
  fail "printer columns are '$header', expected 'NAME STRATEGY STATE WORKERS STEP AGE'"
row="$(k get dtj multi-worker-mirrored -n "$NS" --no-headers | tr -s ' ')"
[[ "$row" =~ ^multi-worker-mirrored\ MultiWorkerMirrored\ (\<none\>\ )?3\ (\<none\>\ )?[0-9]+s$ ]] ||
  fail "the row of multi-worker-mirrored is '$row', expected its strategy, 3 workers and an age"
pass "columns NAME STRATEGY STATE WORKERS STEP AGE; row: $row"

# --- 6. Short name and category ----------------------------------------------
say "6. short name dtj and category distrain"
for resource in dtj distrain; do
  listed="$(k get "$resource" -n "$NS" -o name 2>&1 | sort)" || fail "kubectl get $resource failed: $listed"
  n="$(wc -l <<<"$listed")"
  [ "$n" = "${#examples[@]}" ] && grep -qx 'distributedtrainingjob.distrain.io/parameter-server' <<<"$listed" ||
    fail "kubectl get $resource listed $n objects, expected the ${#examples[@]} jobs:
$listed"
  pass "kubectl get $resource lists the ${#examples[@]} jobs"
done

# --- 7. The scale subresource ------------------------------------------------
say "7. kubectl scale on the MultiWorkerMirrored example"
# The example runs Chief + 3 Workers with globalBatchSize 64: 7 workers make 8
# replicas in sync (64 divides), 4 make 5 (it does not, so CEL must refuse).
out="$(k scale dtj multi-worker-mirrored -n "$NS" --replicas=7 2>&1)" || fail "kubectl scale --replicas=7 failed: $out"
got="$(k get dtj multi-worker-mirrored -n "$NS" -o jsonpath='{.spec.replicaSpecs.Worker.replicas}')"
[ "$got" = 7 ] || fail "after kubectl scale --replicas=7, spec.replicaSpecs.Worker.replicas is '$got'"
pass "kubectl scale --replicas=7 set spec.replicaSpecs.Worker.replicas to 7"
scale="$(k get --raw "/apis/distrain.io/v1alpha1/namespaces/$NS/distributedtrainingjobs/multi-worker-mirrored/scale")" ||
  fail "GET .../scale failed: $scale"
read -r kind spec_replicas < <(python3 -c 'import json,sys; s = json.load(sys.stdin); print(s["kind"], s["spec"]["replicas"])' <<<"$scale")
[ "$kind" = Scale ] && [ "$spec_replicas" = 7 ] || fail "/scale returned kind '$kind' with spec.replicas '$spec_replicas', expected Scale with 7: $scale"
pass "/scale is an autoscaling/v1 Scale with spec.replicas 7"
# The operator publishes the pod selector in status.selector; /scale must expose
# it as status.selector (what an HPA reads).
sel='distrain.io/job-name=multi-worker-mirrored,distrain.io/replica-type=worker'
out="$(k patch dtj multi-worker-mirrored -n "$NS" --subresource=status --type=merge \
  -p "{\"status\":{\"selector\":\"$sel\",\"state\":\"Running\",\"replicaStatuses\":{\"Worker\":{\"active\":7}},\"progress\":{\"step\":120}}}" 2>&1)" ||
  fail "patching /status failed: $out"
scale="$(k get --raw "/apis/distrain.io/v1alpha1/namespaces/$NS/distributedtrainingjobs/multi-worker-mirrored/scale")"
read -r status_sel status_replicas < <(python3 -c 'import json,sys; s = json.load(sys.stdin)["status"]; print(s.get("selector", "-"), s.get("replicas", "-"))' <<<"$scale")
[ "$status_sel" = "$sel" ] && [ "$status_replicas" = 7 ] ||
  fail "/scale status is selector '$status_sel' replicas '$status_replicas', expected '$sel' and 7 (from status.selector and status.replicaStatuses.Worker.active)"
pass "/scale status: selector and replicas come from status.selector and status.replicaStatuses.Worker.active"
row="$(k get dtj multi-worker-mirrored -n "$NS" --no-headers | tr -s ' ')"
[[ "$row" =~ ^multi-worker-mirrored\ MultiWorkerMirrored\ Running\ 7\ 120\ [0-9]+s$ ]] ||
  fail "after the status patch the row is '$row', expected State Running, Workers 7, Step 120"
pass "printer columns follow status: $row"
if out="$(k scale dtj multi-worker-mirrored -n "$NS" --replicas=4 2>&1)"; then
  fail "kubectl scale --replicas=4 was accepted although 64 is not divisible by 1 + 4 replicas"
fi
grep -qF 'spec.training.globalBatchSize: must be divisible by the replicas in sync' <<<"$out" ||
  fail "kubectl scale --replicas=4 was refused, but not by the globalBatchSize rule: $out"
got="$(k get dtj multi-worker-mirrored -n "$NS" -o jsonpath='{.spec.replicaSpecs.Worker.replicas}')"
[ "$got" = 7 ] || fail "a refused scale changed spec.replicaSpecs.Worker.replicas to '$got'"
pass "kubectl scale --replicas=4 refused by CEL: $(grep -F 'globalBatchSize' <<<"$out" | head -n1 | cut -c1-300)"
out="$(k scale dtj multi-worker-mirrored -n "$NS" --replicas=3 2>&1)" || fail "kubectl scale --replicas=3 failed: $out"
got="$(k get dtj multi-worker-mirrored -n "$NS" -o jsonpath='{.spec.replicaSpecs.Worker.replicas}')"
[ "$got" = 3 ] || fail "after kubectl scale --replicas=3, spec.replicaSpecs.Worker.replicas is '$got'"
pass "kubectl scale --replicas=3 set it back to 3"

say "PASS: $checks checks"
