#!/usr/bin/env bash
# Every benchmark driver in bench/ answers --help with its usage: a driver
# that parses no arguments or never calls its main (as
# single_process_throughput.py did for a while, printing nothing and exiting
# 0) fails here instead of going unnoticed until someone wants its figures.
set -uo pipefail
cd "$(dirname "$0")/../../.."
failed=0
for driver in bench/*.py; do
  case "$driver" in bench/benchlib.py) continue ;; esac
  out=$(timeout 30 python3 "$driver" --help 2>&1)
  rc=$?
  if [ "$rc" != 0 ] || ! grep -q "^usage: " <<<"$out"; then
    echo "FAIL: $driver --help exited $rc without a usage line:"; echo "$out" | tail -5
    failed=1
  fi
done
[ "$failed" = 0 ] && echo "ok: every bench driver prints its usage"
exit "$failed"
