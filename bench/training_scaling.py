#!/usr/bin/env python3
"""Training scaling: distrain MultiWorkerMirrored vs TensorFlow MultiWorkerMirroredStrategy.

For 1, 2 and 4 workers (processes on 127.0.0.1, TF_CONFIG with one "worker"
job, worker 0 coordinates), both sides train the same model on the same
global batch: MLP 784-1024-1024-10 (ReLU), softmax cross-entropy, Adam lr
1e-3, float32, global batch 256 split evenly over the workers, synthetic
in-memory data sharded by example, gradients all-reduced over a ring every
step. Both are timed over the same number of steps after the same warm-up
(start-up, rendezvous, tracing and the first steps excluded), and the
figure is global examples/s (all workers together).

  distrain  build/worker/distrain-worker processes with TF_CONFIG and a
            generated job YAML (what `distrain run` starts); the rate is read
            from worker 0's log: the timestamps of its progress lines at the
            first and the last timed step
  tf        bench/peers/tf_mwms_mlp.py (custom training loop, ring all-reduce)

The workers share this machine's cores. Each process gets
max(1, cores / workers) compute threads on both sides (distrain:
OPENBLAS_NUM_THREADS, as `distrain run` sets it; TensorFlow: intra-op
threads; --tf-threads default lets TensorFlow pick its own).

  bench/training_scaling.py [--workers 1,2,4] [--steps 100] [--warmup 20] [--repeats 2]

Prints a table (examples/s per side, scaling vs 1 worker, distrain/tf) and
exits 0; non-zero with the failing side's output when a side does not run.
"""
import argparse
import datetime
import json
import os
import re
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import (BUILD, PEERS_PY, ROOT, append_record, fail, job_credentials,  # noqa: E402
                      run_group, tf_configs, uptime)

GLOBAL_BATCH = 256

JOB = """apiVersion: distrain.io/v1alpha1
kind: DistributedTrainingJob
metadata: {{name: bench-scaling}}
spec:
  strategy: MultiWorkerMirrored
  replicaSpecs:
    Worker: {{replicas: {workers}}}
  training:
    model: {{type: mlp, hiddenUnits: [1024, 1024]}}
    dataset: {{type: synthetic, numFeatures: 784, numClasses: 10, numExamples: 20000,
               numEvalExamples: 1000, autoShardPolicy: DATA}}
    optimizer: {{type: adam, learningRate: 0.001}}
    communication: {{implementation: Ring, timeoutSeconds: 120}}
    globalBatchSize: {batch}
    steps: {steps}
    logEverySteps: {log_every}
"""


def threads_per_process(workers):
    return max(1, (os.cpu_count() or 1) // workers)


def distrain_rate(workers, args):
    binary = os.path.join(BUILD, "worker", "distrain-worker")
    if not os.path.exists(binary):
        fail(f"{binary} is missing: build it (scripts/build.sh)")
    total = args.warmup + args.steps
    with tempfile.TemporaryDirectory() as tmp:
        job = os.path.join(tmp, "job.yaml")
        with open(job, "w") as f:
            # Progress lines at every `warmup` steps: the one at step `warmup`
            # starts the clock, the one at the last step stops it.
            f.write(JOB.format(workers=workers, batch=GLOBAL_BATCH, steps=total, log_every=args.warmup))
        cmds = []
        creds = job_credentials([("worker", i) for i in range(workers)], os.path.join(tmp, "identity"))
        for i, cfg in enumerate(tf_configs(workers)):
            env = {k: v for k, v in os.environ.items()
                   if k not in ("DISTRAIN_JOB_CONFIG", "DISTRAIN_CHECKPOINT_DIR", "DISTRAIN_METRICS_PORT")}
            env.update(TF_CONFIG=cfg, OPENBLAS_NUM_THREADS=str(threads_per_process(workers)),
                       DISTRAIN_CREDENTIALS_DIR=os.path.join(creds, f"worker-{i}"))
            cmds.append(([binary, "--config", job], env))
        out = run_group(f"distrain, {workers} worker(s)", cmds, args.timeout)
    stamps = {}
    for m in re.finditer(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+)Z\s+\S+\s+step (\d+)/(\d+) ", out, re.M):
        t = datetime.datetime.fromisoformat(m.group(1)).timestamp()
        stamps[int(m.group(2))] = t
    if args.warmup not in stamps or total not in stamps:
        fail(f"distrain, {workers} worker(s): no progress lines for steps {args.warmup} and {total} "
             f"in worker 0's output:\n{out[-4000:]}")
    return args.steps * GLOBAL_BATCH / (stamps[total] - stamps[args.warmup])


def tf_rate(workers, args):
    py = PEERS_PY if os.path.exists(PEERS_PY) else sys.executable
    argv = [py, os.path.join(ROOT, "bench", "peers", "tf_mwms_mlp.py"), "--steps", str(args.steps),
            "--warmup", str(args.warmup), "--batch", str(GLOBAL_BATCH)]
    if args.tf_threads == "budget":
        argv += ["--intra-op-threads", str(threads_per_process(workers))]
    cmds = [(argv, dict(os.environ, TF_CONFIG=cfg, TF_CPP_MIN_LOG_LEVEL="2")) for cfg in tf_configs(workers)]
    out = run_group(f"tf, {workers} worker(s)", cmds, args.timeout)
    m = re.search(r"^RESULT (\{.*\})$", out, re.M)
    if not m:
        fail(f"tf, {workers} worker(s): worker 0 printed no RESULT line:\n{out[-4000:]}")
    return json.loads(m.group(1))["examples_per_second"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", default="1,2,4", help="comma-separated worker counts")
    ap.add_argument("--steps", type=int, default=100, help="timed steps (a multiple of --warmup)")
    ap.add_argument("--warmup", type=int, default=20, help="steps before the clock starts")
    ap.add_argument("--repeats", type=int, default=2, help="alternate the two sides this many times; best of each")
    ap.add_argument("--tf-threads", choices=("budget", "default"), default="budget",
                    help="budget: TensorFlow gets the same threads per process as distrain; "
                         "default: TensorFlow's own choice")
    ap.add_argument("--timeout", type=float, default=600, help="one side's run for one worker count (s)")
    ap.add_argument("--no-record", action="store_true", help="do not append to bench/records/")
    args = ap.parse_args()
    uptime_before = uptime()
    workers = [int(w) for w in args.workers.split(",")]
    if any(w < 1 or GLOBAL_BATCH % w for w in workers):
        fail(f"--workers: each count must divide the global batch {GLOBAL_BATCH}")
    if args.warmup < 1 or args.steps < 1 or args.steps % args.warmup:
        fail("--steps must be a positive multiple of --warmup")

    started = time.time()
    load = os.getloadavg()[0]
    results = {}
    for w in workers:
        d_rates, t_rates = [], []
        for i in range(args.repeats):
            d_rates.append(distrain_rate(w, args))
            print(f"  {w} worker(s), round {i + 1}: distrain {d_rates[-1]:8.0f} examples/s", flush=True)
            t_rates.append(tf_rate(w, args))
            print(f"  {w} worker(s), round {i + 1}: tf       {t_rates[-1]:8.0f} examples/s", flush=True)
        results[w] = (max(d_rates), max(t_rates))

    print()
    print(f"MLP 784-1024-1024-10, Adam, global batch {GLOBAL_BATCH}, float32, ring all-reduce on 127.0.0.1; "
          f"{os.cpu_count()} cores shared by all workers; {args.steps} timed steps after {args.warmup}; "
          f"best of {args.repeats}; load {load:.2f} at start")
    print(f"{'workers':>7} {'threads/proc':>12} | {'distrain ex/s':>13} {'scaling':>7} | "
          f"{'tf ex/s':>9} {'scaling':>7} | {'distrain/tf':>11}")
    base_d, base_t = results[workers[0]]
    for w in workers:
        d, t = results[w]
        tf_threads = threads_per_process(w) if args.tf_threads == "budget" else "tf"
        print(f"{w:>7} {str(threads_per_process(w)) + '/' + str(tf_threads):>12} | {d:13.0f} "
              f"{d / base_d:6.2f}x | {t:9.0f} {t / base_t:6.2f}x | {d / t:10.2f}x")
    print("ratios distrain/tf: " + ", ".join(f"{w} worker(s) {results[w][0] / results[w][1]:.2f}x"
                                             for w in workers))
    print(f"wall time {time.time() - started:.0f} s; load {load:.2f} at start, {os.getloadavg()[0]:.2f} at end")
    if not args.no_record:
        append_record("training_scaling", [
            {"workers": w, "distrain_examples_per_s": results[w][0], "tf_examples_per_s": results[w][1],
             "distrain_over_tf": results[w][0] / results[w][1]} for w in workers], uptime_before,
            {"repeats": args.repeats, "steps": args.steps, "tf_threads": args.tf_threads})


if __name__ == "__main__":
    main()
