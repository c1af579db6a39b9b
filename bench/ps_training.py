#!/usr/bin/env python3
"""ParameterServer training: distrain vs TensorFlow ParameterServerStrategy.

Both sides run 2 ps tasks and 2 workers plus a coordinator on 127.0.0.1 and
train the same model on the same batches: MLP 784-1024-1024-10 (ReLU),
softmax cross-entropy, Adam lr 1e-3, float32, `--batch` examples per step
closure on one worker, synthetic in-memory data, variables split over the ps
tasks by MinSize(256 KiB, max 2 shards), the optimizer applied on the ps,
asynchronously. Both are timed over the same number of closures after the
same warm-up (start-up, connections, tracing and the first closures
excluded); the figures are closures (steps) per second and examples per
second, all workers together.

  distrain  build/worker/distrain-worker processes: chief (the coordinator),
            2 workers, 2 ps, each with its TF_CONFIG and a generated job YAML
            (what `distrain run` starts); the rate is read from the chief's
            log: the timestamps of its progress lines at the first and the
            last timed step (each line is written when that many closures
            have been scheduled; the last one after all have completed)
  tf        bench/peers/tf_ps_mlp.py: TensorFlow's in-process cluster recipe
            (tf.distribute.Server for every worker and ps in one process,
            ClusterCoordinator scheduling closures, fused ResourceApplyAdam
            on the ps)

The processes share this machine's cores. distrain workers get
max(1, cores / workers) BLAS threads each (what `distrain run` gives them);
TensorFlow's in-process workers share `cores` intra-op threads
(--tf-threads default lets TensorFlow pick its own).

  bench/ps_training.py [--steps 200] [--warmup 20] [--batch 32,256] [--repeats 2] [--cpu]

For each batch size (examples per closure; both sides use the same) prints
both figures from the same run and their ratio; exits non-zero with the
failing side's output when a side does not run. With 256 examples a closure
is mostly the model's arithmetic, which both sides do with the same FLOPs on
the same cores; with 32 the per-closure cost of the parameter server
machinery (scheduling, pull, push, apply) dominates.

--cpu also measures each side's CPU time per closure (user + system, every
process of the side together): each side runs once with --steps closures and
once with a quarter of them, and the difference of their CPU times is divided
by the difference of the closure counts, so start-up, tracing and warm-up
cancel out. When the processes of both sides saturate the same cores, the
throughput ratio tends to the inverse ratio of these figures; unlike steps/s
they do not depend on what else runs on the machine.
"""
import argparse
import datetime
import json
import os
import re
import resource
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import (BUILD, PEERS_PY, ROOT, append_record, fail, free_ports,  # noqa: E402
                      job_credentials, run_group, uptime)

WORKERS = 2
PS = 2

JOB = """apiVersion: distrain.io/v1alpha1
kind: DistributedTrainingJob
metadata: {{name: bench-ps}}
spec:
  strategy: ParameterServer
  security: {{transport: {transport}}}
  replicaSpecs:
    Chief: {{replicas: 1}}
    Worker: {{replicas: {workers}}}
    PS: {{replicas: {ps}}}
  training:
    model: {{type: mlp, hiddenUnits: [1024, 1024]}}
    dataset: {{type: synthetic, numFeatures: 784, numClasses: 10, numExamples: 20000,
               numEvalExamples: 1000}}
    optimizer: {{type: adam, learningRate: 0.001}}
    communication: {{timeoutSeconds: 120}}
    globalBatchSize: {batch}
    steps: {steps}
    logEverySteps: {log_every}
"""


def blas_threads():
    return max(1, (os.cpu_count() or 1) // WORKERS)


def distrain_rate(args, batch, transport="MutualTLS"):
    """Closures per second; transport MutualTLS (the default of every job) or
    Plaintext (bench/security_cost.py compares the two)."""
    binary = os.path.join(BUILD, "worker", "distrain-worker")
    if not os.path.exists(binary):
        fail(f"{binary} is missing: build it (scripts/build.sh)")
    total = args.warmup + args.steps
    ports = free_ports(1 + WORKERS + PS)
    cluster = {"chief": [f"127.0.0.1:{ports[0]}"],
               "worker": [f"127.0.0.1:{p}" for p in ports[1:1 + WORKERS]],
               "ps": [f"127.0.0.1:{p}" for p in ports[1 + WORKERS:]]}
    tasks = [("chief", 0)] + [("worker", i) for i in range(WORKERS)] + [("ps", i) for i in range(PS)]
    with tempfile.TemporaryDirectory() as tmp:
        job = os.path.join(tmp, "job.yaml")
        with open(job, "w") as f:
            # Progress lines every `warmup` steps: the one at step `warmup`
            # starts the clock, the one at the last step stops it.
            f.write(JOB.format(workers=WORKERS, ps=PS, batch=batch, steps=total,
                               log_every=args.warmup, transport=transport))
        creds = job_credentials(tasks, os.path.join(tmp, "identity")) if transport == "MutualTLS" else None
        cmds = []
        for task_type, index in tasks:
            env = {k: v for k, v in os.environ.items()
                   if k not in ("DISTRAIN_JOB_CONFIG", "DISTRAIN_CHECKPOINT_DIR", "DISTRAIN_METRICS_PORT")}
            env.update(TF_CONFIG=json.dumps({"cluster": cluster,
                                             "task": {"type": task_type, "index": index}}),
                       OPENBLAS_NUM_THREADS=str(blas_threads() if task_type == "worker" else 1))
            if creds:
                env["DISTRAIN_CREDENTIALS_DIR"] = os.path.join(creds, f"{task_type}-{index}")
            cmds.append(([binary, "--config", job], env))
        # ps tasks serve until stopped: run the chief and workers as the
        # group, the ps tasks beside it.
        import subprocess
        ps_procs = [subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
                    for argv, env in cmds[1 + WORKERS:]]
        try:
            outs = run_group("distrain", cmds[:1 + WORKERS], args.timeout, all_outputs=True)
        finally:
            for p in ps_procs:
                p.terminate()
            for p in ps_procs:
                p.wait()
    out = outs[0]
    stamps = {}
    for m in re.finditer(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+)Z\s+\S+\s+step (\d+)/(\d+) ", out, re.M):
        stamps[int(m.group(2))] = datetime.datetime.fromisoformat(m.group(1)).timestamp()
    if args.warmup not in stamps or total not in stamps:
        fail(f"distrain: no progress lines for steps {args.warmup} and {total} in the chief's "
             f"output:\n{out[-4000:]}")
    for w in outs[1:]:
        m = re.search(r"mean pull ([0-9.]+) ms, compute ([0-9.]+) ms, push ([0-9.]+) ms", w)
        if m:
            print(f"    distrain worker: pull {m.group(1)} ms, compute {m.group(2)} ms, "
                  f"push {m.group(3)} ms per closure", flush=True)
    return args.steps / (stamps[total] - stamps[args.warmup])


def tf_rate(args, batch):
    py = PEERS_PY if os.path.exists(PEERS_PY) else sys.executable
    argv = [py, os.path.join(ROOT, "bench", "peers", "tf_ps_mlp.py"), "--steps", str(args.steps),
            "--warmup", str(args.warmup), "--batch", str(batch), "--workers", str(WORKERS),
            "--ps", str(PS)]
    if args.tf_threads == "budget":
        argv += ["--intra-op-threads", str(os.cpu_count() or 1)]
    out = run_group("tf", [(argv, dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))], args.timeout)
    m = re.search(r"^RESULT (\{.*\})$", out, re.M)
    if not m:
        fail(f"tf: printed no RESULT line:\n{out[-4000:]}")
    return json.loads(m.group(1))["steps_per_second"]


def children_cpu():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def cpu_per_closure(rate_fn, args, batch):
    """CPU seconds per closure of one side (see --cpu): the difference of two
    runs' CPU (every finished child process) over their closure counts."""
    short = argparse.Namespace(**vars(args))
    short.steps = max(args.warmup, (args.steps // 4) // args.warmup * args.warmup)
    if short.steps >= args.steps:
        fail("--cpu needs --steps of at least 2 x --warmup")
    before = children_cpu()
    rate_fn(short, batch)
    middle = children_cpu()
    rate_fn(args, batch)
    after = children_cpu()
    return ((after - middle) - (middle - before)) / (args.steps - short.steps)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=200, help="timed closures (a multiple of --warmup)")
    ap.add_argument("--warmup", type=int, default=20, help="closures before the clock starts")
    ap.add_argument("--batch", default="32,256", help="comma-separated examples per closure")
    ap.add_argument("--repeats", type=int, default=2, help="alternate the two sides this many times; best of each")
    ap.add_argument("--tf-threads", choices=("budget", "default"), default="budget",
                    help="budget: TensorFlow's workers share as many threads as this machine has "
                         "cores, like distrain's; default: TensorFlow's own choice")
    ap.add_argument("--timeout", type=float, default=900, help="one side's run (s)")
    ap.add_argument("--cpu", action="store_true",
                    help="also measure each side's CPU time per closure (two more runs per side)")
    ap.add_argument("--no-record", action="store_true", help="do not append to bench/records/")
    args = ap.parse_args()
    if args.warmup < 1 or args.steps < 1 or args.steps % args.warmup:
        fail("--steps must be a positive multiple of --warmup")

    batches = [int(b) for b in args.batch.split(",")]
    uptime_before = uptime()
    started = time.time()
    load = os.getloadavg()[0]
    results = {}
    cpu = {}
    for batch in batches:
        d_rates, t_rates = [], []
        for i in range(args.repeats):
            # Plaintext like TensorFlow's insecure gRPC: the same work on both
            # sides. Jobs run mutual TLS by default; bench/security_cost.py
            # measures what that costs.
            d_rates.append(distrain_rate(args, batch, "Plaintext"))
            print(f"  batch {batch}, round {i + 1}: distrain {d_rates[-1]:7.2f} steps/s", flush=True)
            t_rates.append(tf_rate(args, batch))
            print(f"  batch {batch}, round {i + 1}: tf       {t_rates[-1]:7.2f} steps/s", flush=True)
        results[batch] = (max(d_rates), max(t_rates))
        if args.cpu:
            cpu[batch] = (cpu_per_closure(lambda a, b: distrain_rate(a, b, "Plaintext"), args, batch),
                          cpu_per_closure(tf_rate, args, batch))
            print(f"  batch {batch}: CPU per closure distrain {cpu[batch][0] * 1000:.1f} ms, "
                  f"tf {cpu[batch][1] * 1000:.1f} ms", flush=True)
    print()
    print(f"ParameterServer, {WORKERS} workers + {PS} ps + coordinator on 127.0.0.1; MLP 784-1024-1024-10, "
          f"Adam, float32; {os.cpu_count()} cores shared by all processes; {args.steps} timed closures "
          f"after {args.warmup}; best of {args.repeats}")
    print(f"{'batch':>6} | {'distrain steps/s':>16} {'examples/s':>10} | {'tf steps/s':>10} "
          f"{'examples/s':>10} | {'distrain/tf':>11}")
    for batch in batches:
        d, t = results[batch]
        print(f"{batch:>6} | {d:16.2f} {d * batch:10.0f} | {t:10.2f} {t * batch:10.0f} | {d / t:10.2f}x")
    print("ratios distrain/tf: " + ", ".join(f"batch {b} {results[b][0] / results[b][1]:.2f}x"
                                             for b in batches))
    if cpu:
        print(f"{'batch':>6} | {'distrain CPU ms/closure':>23} | {'tf CPU ms/closure':>17} | {'tf/distrain':>11}")
        for batch in batches:
            d, t = cpu[batch]
            print(f"{batch:>6} | {d * 1000:23.1f} | {t * 1000:17.1f} | {t / d:10.2f}x")
    print(f"wall time {time.time() - started:.0f} s; load {load:.2f} at start, {os.getloadavg()[0]:.2f} at end")
    if not args.no_record:
        append_record("ps_training", [
            {"batch": b, "distrain_steps_per_s": results[b][0], "tf_steps_per_s": results[b][1],
             "distrain_over_tf": results[b][0] / results[b][1],
             **({"distrain_cpu_s_per_closure": cpu[b][0], "tf_cpu_s_per_closure": cpu[b][1]} if b in cpu else {})}
            for b in batches], uptime_before, {"repeats": args.repeats, "steps": args.steps,
                                               "distrain_transport": "Plaintext"})


if __name__ == "__main__":
    main()
