#!/usr/bin/env python3
"""Runs a GoogleTest binary's filter to the end across crashes and hangs.

scripts/gpu-check.sh runs the GPU suites with it on a lent GPU, where a
session has minutes of device time and GPU code runs for the first time: a
CHECK failure (abort) or a hung kernel in one test must not hide every test
after it. So:

  1. List the tests the filter selects (--gtest_list_tests).
  2. Run the binary on what is left, with a wall-clock limit per run.
  3. Read its output: every test that ended (OK, FAILED, SKIPPED) is done. If
     the run did not finish (a signal, a non-gtest exit, the limit), the test
     it had started and not ended is marked CRASHED or HUNG and done too.
  4. Repeat 2-3 until no test is left, then print one line per test that did
     not pass and a summary line.

Exit status: 0 when every test passed or skipped, 1 when one failed, crashed
or hung, 2 on bad usage, 4 when every test was skipped (no GPU seen: the
point of the run is lost). Output goes to stdout (gpu-check.sh tees it into
its log).
"""

import argparse
import re
import selectors
import subprocess
import sys
import time

RESULT = re.compile(r"^\[\s+(OK|FAILED|SKIPPED)\s+\] ([^\s,]+)")
STARTED = re.compile(r"^\[ RUN\s+\] (\S+)$")
FINISHED = re.compile(r"^\[=+\] \d+ tests? from \d+ test suites? ran\.")


def list_tests(binary, gtest_filter):
    """Full test names (Suite.Test, parameterised ones with their prefix and suffix)."""
    out = subprocess.run([binary, f"--gtest_filter={gtest_filter}", "--gtest_list_tests"],
                         capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        sys.exit(f"gpu_test_runner: {binary} --gtest_list_tests exited {out.returncode}:\n"
                 f"{out.stdout}{out.stderr}")
    tests, suite = [], None
    for line in out.stdout.splitlines():
        if not line.strip() or line.startswith("Running main()"):
            continue
        if not line.startswith(" "):
            suite = line.split("#")[0].strip()  # "Gpus/OpsDeviceTest."
        elif suite is not None:
            tests.append(suite + line.split("#")[0].strip())
    return tests


def run_once(binary, tests, seconds):
    """Runs `tests`; returns (results {test: outcome}, started-but-unended test, finished?)."""
    cmd = [binary, "--gtest_filter=" + ":".join(tests)]
    results, running, finished = {}, None, False
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            bufsize=1)
    deadline = time.monotonic() + seconds
    timed_out = False
    try:
        # Line by line, so the log shows progress even if the run hangs; a
        # silent hang ends at the deadline.
        sel = selectors.DefaultSelector()
        sel.register(proc.stdout, selectors.EVENT_READ)
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                timed_out = True
                break
            if not sel.select(timeout=min(remaining, 1.0)):
                if proc.poll() is not None:
                    break
                continue
            line = proc.stdout.readline()
            if not line:
                break
            sys.stdout.write(line)
            sys.stdout.flush()
            line = line.rstrip("\n")
            m = STARTED.match(line)
            if m:
                running = m.group(1)
                continue
            m = RESULT.match(line)
            if m and m.group(2) in tests:
                results[m.group(2)] = m.group(1)
                if m.group(2) == running:
                    running = None
                continue
            if FINISHED.match(line):
                finished = True
    finally:
        if timed_out:
            proc.kill()
        proc.wait()
    if timed_out:
        return results, running, "HUNG"
    if not finished:
        return results, running, f"CRASHED (exit {proc.returncode})"
    return results, None, None


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("binary", help="the GoogleTest binary")
    ap.add_argument("--filter", required=True, help="a --gtest_filter (positive patterns)")
    ap.add_argument("--run-seconds", type=float, default=300,
                    help="wall-clock limit of one run of the binary; a test still running "
                         "then is HUNG")
    args = ap.parse_args()
    if "-" in args.filter:
        sys.exit("gpu_test_runner: --filter takes positive patterns only")

    tests = list_tests(args.binary, args.filter)
    if not tests:
        print(f"gpu_test_runner: the filter {args.filter} selects no test")
        return 2
    outcome = {}
    while True:
        left = [t for t in tests if t not in outcome]
        if not left:
            break
        results, running, broke = run_once(args.binary, left, args.run_seconds)
        outcome.update(results)
        if broke is None:
            # A normal end that left tests unreported would loop forever.
            for t in left:
                outcome.setdefault(t, "NOT REPORTED")
            break
        victim = running if running in left else None
        if victim is None:
            # Broke before any test started, or between tests: nothing to blame.
            for t in left:
                outcome.setdefault(t, broke.split()[0] + " (before it started)")
            print(f"gpu_test_runner: the binary {broke} outside any test; stopping")
            break
        outcome[victim] = broke
        print(f"gpu_test_runner: {victim} {broke}; running the {len(left) - len(results) - 1} "
              "tests left in a fresh process")

    passed = sum(1 for v in outcome.values() if v == "OK")
    skipped = sum(1 for v in outcome.values() if v == "SKIPPED")
    bad = {t: v for t, v in outcome.items() if v not in ("OK", "SKIPPED")}
    for t in tests:
        if t in bad:
            print(f"gpu_test_runner: {bad[t]}: {t}")
    print(f"gpu_test_runner: {len(tests)} tests: {passed} passed, {skipped} skipped, "
          f"{len(bad)} failed, crashed or hung")
    if bad:
        return 1
    if skipped == len(tests):
        return 4
    return 0


if __name__ == "__main__":
    sys.exit(main())
