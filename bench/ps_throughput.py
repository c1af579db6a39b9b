#!/usr/bin/env python3
"""Parameter-server push+pull throughput against the loopback limit, same run.

One ps process and W = 1, 2, 3 worker processes on 127.0.0.1, all
build/bench/ps_throughput (ps_throughput.cc): the ps serves one PsService
(what a ps task of the ParameterServer strategy runs); each worker, through
PsClient (what the strategy's workers use), repeats one operation: Pull the
whole variable, then Push a gradient of the same size, which the ps applies
with its optimizer (SGD by default). All workers share one variable, as the
workers of a job share the model. Tensor sizes:

  16 MiB   bandwidth: GB/s = (bytes pulled + bytes pushed) / s, all workers
  4 KiB    latency-bound: ops/s = push+pull pairs / s, all workers

The peer is the loopback itself: build/bench/loopback_limit --streams W, the
aggregate TCP throughput of W concurrent streams on 127.0.0.1 (best of 3
one-second repeats, measured before and after the ps runs, the higher
counts). Each worker keeps one gRPC connection busy with the ps, so W
streams through one server process is the same shape; `ps/limit` is the
fraction of the ceiling the ps reaches at 16 MiB.

Protocol per (W, size): start the ps and wait for READY; start the workers
with a common wall-clock start instant; each warms up (--warmup s), then
times operations for --seconds and reports its rate over the span from the
first timed operation's start to the last one's end; rates are summed.

  bench/ps_throughput.py [--workers 1,2,3] [--sizes 16M,4K] [--seconds 2]
                         [--variable shared|own] [--optimizer sgd|adam]

Not a pass/fail test: exit 0 when every run finished; non-zero with the
failing process's output otherwise.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import BUILD, append_record, fail, free_ports, run_group, uptime  # noqa: E402

KIB, MIB = 1 << 10, 1 << 20


def parse_size(text):
    m = re.fullmatch(r"\s*(\d+)\s*([KkMm]?)(i?[Bb])?\s*", text)
    if not m:
        fail(f"--sizes: cannot read '{text}' (use bytes, or 4K, 16M)")
    value = int(m.group(1)) * {"": 1, "k": KIB, "m": MIB}[m.group(2).lower()]
    if value <= 0 or value % 4:
        fail(f"--sizes: {text} is not a positive multiple of 4 bytes (float32)")
    return value


def human_size(n):
    for unit, scale in (("MiB", MIB), ("KiB", KIB)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n} B"


def binary(name):
    path = os.path.join(BUILD, "bench", name)
    if not os.path.exists(path):
        fail(f"{path} is missing: build it (scripts/build.sh, or ninja -C {BUILD} {name})")
    return path


def results(name, text):
    out = [json.loads(m.group(1)) for m in re.finditer(r"^RESULT (\{.*\})$", text, re.M)]
    if not out:
        fail(f"{name}: no RESULT line; output:\n{text[-4000:]}")
    return out


def loopback(streams):
    out = run_group(f"loopback {streams} streams",
                    [([binary("loopback_limit"), "--streams", str(streams)], None)], 120)
    return results("loopback", out)[0]["bytes_per_second"]


def ps_run(workers, size, args, credentials_root=None):
    """Aggregate {ops_per_second, bytes_per_second, median_op_s} of one ps + W workers.
    credentials_root: a `distrain credentials` directory (ps-0, chief-0, worker-<i>) for
    mutual TLS, as jobs run by default; None: plaintext."""
    tool = binary("ps_throughput")
    port = free_ports(1)[0]

    def creds(task):
        return ["--credentials-dir", os.path.join(credentials_root, task)] if credentials_root else []

    ps = subprocess.Popen([tool, "--role", "ps", "--port", str(port), "--optimizer", args.optimizer,
                           "--chunk-bytes", str(args.chunk_bytes)] + creds("ps-0"),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        line = ps.stdout.readline()
        if not line.startswith("READY"):
            fail(f"ps did not start: {line}{ps.stdout.read() if ps.poll() is not None else ''}")
        start_at = time.time() + 2.0 + 0.5 * workers  # every worker connected and initialised
        cmds = []
        for w in range(workers):
            argv = [tool, "--role", "worker", "--ps", f"127.0.0.1:{port}", "--worker", str(w),
                    "--tensor-bytes", str(size), "--start-at", f"{start_at:.6f}",
                    "--warmup", str(args.warmup), "--seconds", str(args.seconds),
                    "--variable", args.variable, "--chunk-bytes", str(args.chunk_bytes)]
            # Worker 0 declares the variable, which the ps allows the chief only.
            cmds.append((argv + creds("chief-0" if w == 0 else f"worker-{w}"), None))
        outs = run_group(f"ps W={workers} {human_size(size)}", cmds,
                         args.seconds + args.warmup + 120, all_outputs=True)
    finally:
        ps.terminate()
        try:
            ps.wait(10)
        except subprocess.TimeoutExpired:
            ps.kill()
    rs = [r for o in outs for r in results(f"ps W={workers} {human_size(size)}", o)]
    if len(rs) != workers:
        fail(f"expected {workers} RESULT lines, got {len(rs)}")
    return {"ops_per_second": sum(r["ops_per_second"] for r in rs),
            "bytes_per_second": sum(r["bytes_per_second"] for r in rs),
            "median_op_s": sorted(r["median_op_s"] for r in rs)[len(rs) // 2],
            "median_pull_s": sorted(r["median_pull_s"] for r in rs)[len(rs) // 2],
            "median_push_s": sorted(r["median_push_s"] for r in rs)[len(rs) // 2],
            "ops": sum(r["ops"] for r in rs)}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", default="1,2,3", help="comma-separated worker counts")
    ap.add_argument("--sizes", default="16M,4K", help="comma-separated tensor sizes (4K, 16M allowed)")
    ap.add_argument("--seconds", type=float, default=2.0, help="timed seconds per run")
    ap.add_argument("--warmup", type=float, default=0.5, help="untimed seconds per run first")
    ap.add_argument("--variable", default="shared", choices=["shared", "own"],
                    help="one variable for all workers (default), or one each")
    ap.add_argument("--optimizer", default="sgd", choices=["sgd", "adam"],
                    help="what the ps applies to each push")
    ap.add_argument("--chunk-bytes", type=int, default=1 << 20, help="streamed chunk payload")
    ap.add_argument("--no-record", action="store_true", help="do not append to bench/records/")
    args = ap.parse_args()
    uptime_before = uptime()
    workers = [int(w) for w in args.workers.split(",")]
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    if any(w < 1 for w in workers):
        fail("--workers: every count must be at least 1")

    load = os.getloadavg()[0]
    started = time.time()
    table = {}
    limits = {}
    for w in workers:
        before = loopback(w)
        for size in sizes:
            table[(w, size)] = ps_run(w, size, args)
            r = table[(w, size)]
            print(f"W={w} {human_size(size)}: {r['ops_per_second']:.0f} ops/s, "
                  f"{r['bytes_per_second'] / 1e9:.3f} GB/s", flush=True)
        after = loopback(w)
        limits[w] = max(before, after)
        print(f"W={w}: loopback {before / 1e9:.2f} GB/s before, {after / 1e9:.2f} GB/s after",
              flush=True)

    print()
    print(f"PS push+pull, 1 ps + W workers on 127.0.0.1, variable {args.variable}, "
          f"optimizer {args.optimizer}, chunk {human_size(args.chunk_bytes)}; "
          f"load average {load:.2f} at start")
    print(f"{'W':>2} {'size':>8} {'ops/s':>10} {'GB/s':>8} {'op median':>10} {'pull':>10} "
          f"{'push':>10} {'loopback GB/s':>14} {'ps/limit':>9}")

    def t(s):
        return f"{s * 1e6:.0f} us" if s < 1e-3 else f"{s * 1e3:.2f} ms"

    for w in workers:
        for size in sizes:
            r = table[(w, size)]
            print(f"{w:>2} {human_size(size):>8} {r['ops_per_second']:>10.0f} "
                  f"{r['bytes_per_second'] / 1e9:>8.3f} {t(r['median_op_s']):>10} "
                  f"{t(r['median_pull_s']):>10} {t(r['median_push_s']):>10} "
                  f"{limits[w] / 1e9:>14.2f} {r['bytes_per_second'] / limits[w]:>9.1%}")
    print(f"\ntotal {time.time() - started:.0f} s")
    if not args.no_record:
        append_record("ps_throughput", [
            {"workers": w, "bytes": size, **table[(w, size)], "loopback_bytes_per_s": limits[w]}
            for w in workers for size in sizes], uptime_before,
            {"variable": args.variable, "optimizer": args.optimizer, "transport": "Plaintext"})


if __name__ == "__main__":
    main()
