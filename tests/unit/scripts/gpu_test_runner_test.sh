#!/usr/bin/env bash
# scripts/gpu_test_runner.py (how gpu-check.sh runs the GPU suites) against a
# fake GoogleTest binary whose tests pass, abort, hang and fail: every test
# still gets its verdict, each crash or hang costs only its own test, and a
# run where everything skipped (no GPU) is not a pass.
set -euo pipefail
runner="$(cd "$(dirname "$0")/../../.." && pwd)/scripts/gpu_test_runner.py"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
cat >"$dir/fake_gtest" <<'PY'
#!/usr/bin/env python3
import os, sys, time
tests = ["Gpus/OpsTest.Passes/0", "Gpus/OpsTest.Aborts/0", "Gpus/OpsTest.Hangs/0",
         "Gpus/OpsTest.Fails/0", "ModelTest.PassesToo"]
mode = os.environ.get("FAKE_MODE", "mixed")
args = dict(a.split("=", 1) if "=" in a else (a, "") for a in sys.argv[1:])
if "--gtest_list_tests" in args:
    print("Running main() from fake")
    print("Gpus/OpsTest.")
    for n in ("Passes/0", "Aborts/0", "Hangs/0", "Fails/0"):
        print(f"  {n}  # GetParam() = 0")
    print("ModelTest.\n  PassesToo")
    sys.exit(0)
chosen = [t for t in tests if t in args["--gtest_filter"].split(":")]
for t in chosen:
    print(f"[ RUN      ] {t}", flush=True)
    if mode == "skip":
        print(f"[  SKIPPED ] {t} (0 ms)", flush=True); continue
    if "Aborts" in t: os.abort()
    if "Hangs" in t: time.sleep(60)
    print(f"[{'  FAILED  ' if 'Fails' in t else '       OK '}] {t} (1 ms)", flush=True)
print(f"[==========] {len(chosen)} tests from 2 test suites ran. (5 ms total)", flush=True)
sys.exit(1 if any("Fails" in t for t in chosen) else 0)
PY
chmod +x "$dir/fake_gtest"

set +e
out=$(python3 "$runner" "$dir/fake_gtest" --filter '*OpsTest*:*ModelTest*' --run-seconds 3)
rc=$?
set -e
echo "$out"
fail() { echo "FAIL: $*" >&2; exit 1; }
[ "$rc" = 1 ] || fail "exit $rc, want 1 (a test failed, crashed or hung)"
grep -q '^gpu_test_runner: CRASHED (exit -6): Gpus/OpsTest.Aborts/0$' <<<"$out" || fail "the abort is not blamed on its test"
grep -q '^gpu_test_runner: HUNG: Gpus/OpsTest.Hangs/0$' <<<"$out" || fail "the hang is not blamed on its test"
grep -q '^gpu_test_runner: FAILED: Gpus/OpsTest.Fails/0$' <<<"$out" || fail "the failure is not reported"
grep -q '5 tests: 2 passed, 0 skipped, 3 failed, crashed or hung' <<<"$out" || fail "the tests after the crash and the hang did not all run"
grep -q '^\[       OK \] ModelTest.PassesToo' <<<"$out" || fail "the last test never ran"

set +e
FAKE_MODE=skip python3 "$runner" "$dir/fake_gtest" --filter '*' --run-seconds 3 >/dev/null
rc=$?
set -e
[ "$rc" = 4 ] || fail "all skipped: exit $rc, want 4"
echo "PASS"
