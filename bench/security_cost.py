#!/usr/bin/env python3
"""The cost of job authentication (docs/security.md): the same runs with and
without the job's credentials, interleaved in one invocation.

  all-reduce  build/bench/allreduce_busbw (what MultiWorkerMirrored runs: the
              coordination service for rendezvous, then the ring) with N ranks
              on 127.0.0.1. With credentials the rendezvous is mutual TLS and
              every ring connection passes the HMAC challenge-response; the
              ring's data path is the same. Figure: median all-reduce time,
              mTLS / plaintext (target <= 1.05 at 64 MiB).
  ps training bench/ps_training.py's job (chief, 2 workers, 2 ps, MLP
              784-1024-1024-10, Adam) run as distrain-worker processes with
              spec.security.transport MutualTLS and Plaintext. Figure: steps
              (closures) per second, mTLS / plaintext (target >= 0.95).
  ps          build/bench/ps_throughput (a ps and W workers, each repeating a
              Pull + Push of one variable, what ParameterServer workers do)
              over gRPC. With credentials every stream is TLS 1.3 (AES-GCM).
              Figure: push+pull pairs per second, mTLS / plaintext: the
              raw transport, where every byte is encrypted and decrypted once.

Credentials come from `distrain credentials` (a fresh CA per run). The two
modes alternate round by round (plaintext first in odd rounds, mTLS first in
even ones), and each figure is the median over rounds.

  bench/security_cost.py [--rounds 3] [--ranks 2,4] [--sizes 4K,64M]
                         [--ps-workers 2] [--ps-sizes 4K,16M] [--no-record]

Appends one JSON line to bench/records/security_cost.jsonl (machine, load
before and after, every figure and ratio) unless --no-record.
"""
import argparse
import json
import os
import statistics
import sys
import tempfile
from types import SimpleNamespace

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import append_record, cpu_info, fail, job_credentials, run_group, tf_configs, uptime  # noqa: E402
import ps_throughput  # noqa: E402
import ps_training  # noqa: E402

KIB, MIB = 1 << 10, 1 << 20


def allreduce(n, sizes, creds, args):
    """{size: median seconds} of one group of N ranks."""
    argv = [ps_throughput.binary("allreduce_busbw"), "--sizes", ",".join(map(str, sizes)),
            "--warmup", "3", "--min-iters", "10", "--max-iters", "200",
            "--target-seconds", str(args.target_seconds)]
    cmds = []
    for i, cfg in enumerate(tf_configs(n)):
        env = dict(os.environ, TF_CONFIG=cfg)
        if creds:
            env["DISTRAIN_CREDENTIALS_DIR"] = os.path.join(creds, f"worker-{i}")
        cmds.append((argv, env))
    out = run_group(f"allreduce N={n} {'mtls' if creds else 'plaintext'}", cmds, 600)
    results = {}
    for line in out.splitlines():
        if line.startswith("RESULT "):
            r = json.loads(line[len("RESULT "):])
            results[r["bytes"]] = r["median_s"]
    missing = [s for s in sizes if s not in results]
    if missing:
        fail(f"allreduce N={n}: no RESULT for {missing}; output:\n{out[-3000:]}")
    return results


def human(n):
    return f"{n // MIB} MiB" if n >= MIB else f"{n // KIB} KiB"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--ranks", default="2,4")
    ap.add_argument("--sizes", default="4K,64M")
    ap.add_argument("--ps-workers", type=int, default=2)
    ap.add_argument("--ps-sizes", default="4K,16M")
    ap.add_argument("--seconds", type=float, default=2.0, help="timed seconds per ps run")
    ap.add_argument("--ps-batches", default="32,256",
                    help="ParameterServer training (bench/ps_training.py's job): examples per closure")
    ap.add_argument("--ps-steps", type=int, default=200, help="timed closures per training run")
    ap.add_argument("--target-seconds", type=float, default=1.0, help="timed seconds per all-reduce size")
    ap.add_argument("--no-record", action="store_true")
    args = ap.parse_args()
    ranks = [int(x) for x in args.ranks.split(",")]
    sizes = [ps_throughput.parse_size(x) for x in args.sizes.split(",")]
    ps_sizes = [ps_throughput.parse_size(x) for x in args.ps_sizes.split(",")]
    args.ps_batches = [int(x) for x in args.ps_batches.split(",") if x]
    load_before = uptime()
    print(f"uptime: {load_before}\nmachine: {cpu_info()}", flush=True)

    with tempfile.TemporaryDirectory() as tmp:
        tasks = [("worker", i) for i in range(max(max(ranks), args.ps_workers))] + [("ps", 0), ("chief", 0)]
        creds = job_credentials(tasks, os.path.join(tmp, "identity"))
        ar = {(n, s, m): [] for n in ranks for s in sizes for m in ("plaintext", "mtls")}
        ps = {(s, m): [] for s in ps_sizes for m in ("plaintext", "mtls")}
        training = {(b, m): [] for b in args.ps_batches for m in ("plaintext", "mtls")}
        training_args = SimpleNamespace(warmup=20, steps=args.ps_steps, timeout=600)
        ps_args = SimpleNamespace(optimizer="sgd", chunk_bytes=1 << 20, warmup=0.5,
                                  seconds=args.seconds, variable="shared")
        for r in range(args.rounds):
            modes = ["plaintext", "mtls"] if r % 2 == 0 else ["mtls", "plaintext"]
            for n in ranks:
                for mode in modes:
                    got = allreduce(n, sizes, creds if mode == "mtls" else None, args)
                    for s in sizes:
                        ar[(n, s, mode)].append(got[s])
            for s in ps_sizes:
                for mode in modes:
                    got = ps_throughput.ps_run(args.ps_workers, s, ps_args,
                                               credentials_root=creds if mode == "mtls" else None)
                    ps[(s, mode)].append(got["ops_per_second"])
            for b in args.ps_batches:
                for mode in modes:
                    rate = ps_training.distrain_rate(
                        training_args, b, "MutualTLS" if mode == "mtls" else "Plaintext")
                    training[(b, mode)].append(rate)
            print(f"round {r + 1}/{args.rounds} done", flush=True)

    figures = {"allreduce": [], "ps": []}
    print(f"\nall-reduce, median time (mTLS / plaintext: <= 1.05 is the target)")
    for n in ranks:
        for s in sizes:
            p = statistics.median(ar[(n, s, "plaintext")])
            t = statistics.median(ar[(n, s, "mtls")])
            figures["allreduce"].append({"ranks": n, "bytes": s, "plaintext_s": p, "mtls_s": t,
                                         "mtls_over_plaintext": t / p})
            print(f"  N={n} {human(s):>7}: plaintext {p * 1e3:9.3f} ms  mTLS {t * 1e3:9.3f} ms  "
                  f"ratio {t / p:.3f}")
    print(f"\nparameter server, W={args.ps_workers}, push+pull pairs/s (mTLS / plaintext: >= 0.95 is the target)")
    for s in ps_sizes:
        p = statistics.median(ps[(s, "plaintext")])
        t = statistics.median(ps[(s, "mtls")])
        figures["ps"].append({"workers": args.ps_workers, "bytes": s, "plaintext_ops_per_s": p,
                              "mtls_ops_per_s": t, "mtls_over_plaintext": t / p})
        print(f"  {human(s):>7}: plaintext {p:9.1f}/s  mTLS {t:9.1f}/s  ratio {t / p:.3f}")
    figures["ps_training"] = []
    print(f"\nParameterServer training (2 ps, 2 workers, MLP 784-1024-1024-10, Adam), steps/s "
          f"(mTLS / plaintext: >= 0.95 is the target)")
    for b in args.ps_batches:
        p = statistics.median(training[(b, "plaintext")])
        t = statistics.median(training[(b, "mtls")])
        figures["ps_training"].append({"batch": b, "plaintext_steps_per_s": p,
                                       "mtls_steps_per_s": t, "mtls_over_plaintext": t / p})
        print(f"  batch {b:4d}: plaintext {p:8.1f}/s  mTLS {t:8.1f}/s  ratio {t / p:.3f}")
    load_after = uptime()
    print(f"uptime: {load_after}")
    if not args.no_record:
        append_record("security_cost", figures, load_before, {"rounds": args.rounds})


if __name__ == "__main__":
    main()
