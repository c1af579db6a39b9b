#!/usr/bin/env python3
"""Single-process training throughput: distrain vs TensorFlow Keras and PyTorch, same run.

Model MLP 784-1024-1024-10 (ReLU), softmax cross-entropy, Adam, float32,
batch 256, on the CPU or (--device gpu) a GPU. Every side trains on in-memory
synthetic data of the same shape; all are timed over the same number of steps
after a warm-up, so data generation, start-up and graph tracing are excluded.
Peak RSS is the whole process's (wait4's ru_maxrss). Sides: distrain
(distrain-worker, OneDevice: GPU 0 when a CUDA build sees one), tf
(peers/tf_keras_mlp.py, tensorflow-cpu: CPU only), torch (peers/torch_mlp.py,
PyTorch eager; torch from bench/peers/setup_torch.sh or $DISTRAIN_TORCH_PYTHON).

  bench/single_process_throughput.py [--steps 200] [--warmup 40] [--repeats 2]
                                     [--sides distrain,tf,torch] [--device cpu|gpu]

Prints each figure, the ratios distrain/peer, and exits 0 (not a pass/fail test);
appends one JSON line to bench/records/single_process_throughput.jsonl (machine,
load before and after, every round) unless --no-record.
"""
import argparse
import datetime
import json
import os
import re
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = os.environ.get("DISTRAIN_BUILD_DIR", os.path.join(ROOT, "build"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import append_record, torch_python, uptime  # noqa: E402

PEERS_PY = os.path.join(os.path.expanduser(os.environ.get("DISTRAIN_CACHE", "~/.cache/distrain")),
                        "peers-venv", "bin", "python")

JOB = """apiVersion: distrain.io/v1alpha1
kind: DistributedTrainingJob
metadata: {{name: bench-mlp}}
spec:
  strategy: OneDevice
  replicaSpecs:
    Worker: {{replicas: 1}}
  training:
    model: {{type: mlp, hiddenUnits: [1024, 1024]}}
    dataset: {{type: synthetic, numFeatures: 784, numClasses: 10, numExamples: {examples}, numEvalExamples: 1000}}
    optimizer: {{type: adam, learningRate: 0.001}}
    globalBatchSize: 256
    steps: {steps}
    logEverySteps: {log_every}
"""


def run_measured(cmd, env=None):
    """Runs cmd, returns (stdout+stderr text, peak RSS in MiB, wall seconds)."""
    t0 = time.time()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True)
    out = proc.stdout.read()
    _, status, rusage = os.wait4(proc.pid, 0)
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        sys.exit(f"{cmd[0]} failed with exit code {code}:\n{out}")
    return out, rusage.ru_maxrss / 1024.0, time.time() - t0


def distrain_examples_per_second(steps, warmup):
    worker = os.path.join(BUILD, "worker", "distrain-worker")
    with tempfile.TemporaryDirectory() as tmp:
        job = os.path.join(tmp, "job.yaml")
        with open(job, "w") as f:
            # Log every `warmup` steps: the first interval is the warm-up, the rest are measured.
            f.write(JOB.format(examples=20000, steps=steps + warmup, log_every=warmup))
        env = dict(os.environ)
        env.pop("TF_CONFIG", None)
        out, rss, _ = run_measured([worker, "--config", job], env)
    # Examples over time, end to end from the progress line at step `warmup`
    # to the one at the last step, as the TensorFlow peer is timed (a mean of
    # per-interval rates would lean towards the fast intervals).
    stamps = {}
    for m in re.finditer(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+)Z\s+\S+\s+step (\d+)/(\d+) ", out, re.M):
        stamps[int(m.group(2))] = datetime.datetime.fromisoformat(m.group(1)).timestamp()
    total = steps + warmup
    if warmup not in stamps or total not in stamps:
        sys.exit(f"no progress lines for steps {warmup} and {total} in distrain-worker's output:\n{out}")
    return steps * 256 / (stamps[total] - stamps[warmup]), rss


def tf_examples_per_second(steps, warmup):
    script = os.path.join(ROOT, "bench", "peers", "tf_keras_mlp.py")
    py = PEERS_PY if os.path.exists(PEERS_PY) else sys.executable
    out, rss, _ = run_measured([py, script, "--steps", str(steps), "--warmup", str(warmup)])
    m = re.search(r"^RESULT (\{.*\})$", out, re.M)
    if not m:
        sys.exit(f"TensorFlow peer printed no RESULT line:\n{out}")
    return json.loads(m.group(1))["examples_per_second"], rss


def torch_examples_per_second(steps, warmup, device):
    script = os.path.join(ROOT, "bench", "peers", "torch_mlp.py")
    out, rss, _ = run_measured([torch_python(), script, "--steps", str(steps), "--warmup", str(warmup),
                                "--device", "cuda" if device == "gpu" else "cpu"])
    m = re.search(r"^RESULT (\{.*\})$", out, re.M)
    if not m:
        sys.exit(f"PyTorch peer printed no RESULT line:\n{out}")
    return json.loads(m.group(1))["examples_per_second"], rss


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=40)
    ap.add_argument("--repeats", type=int, default=2, help="alternate the sides this many times; best of each")
    ap.add_argument("--sides", default="distrain,tf", help="subset of distrain,tf,torch (distrain is required)")
    ap.add_argument("--device", choices=["cpu", "gpu"], default="cpu",
                    help="gpu: distrain on GPU 0 (a CUDA build that sees one), PyTorch on cuda:0; no tf side")
    ap.add_argument("--no-record", action="store_true")
    args = ap.parse_args()
    sides = args.sides.split(",")
    if "distrain" not in sides:
        sys.exit("single_process_throughput: --sides must include distrain")
    if args.device == "gpu" and "tf" in sides:
        sys.exit("single_process_throughput: --device gpu has no tf side (the peers' TensorFlow is tensorflow-cpu)")
    load_before = uptime()
    run = {"distrain": lambda: distrain_examples_per_second(args.steps, args.warmup),
           "tf": lambda: tf_examples_per_second(args.steps, args.warmup),
           "torch": lambda: torch_examples_per_second(args.steps, args.warmup, args.device)}
    rates = {s: [] for s in sides}
    rss = {s: [] for s in sides}
    for i in range(args.repeats):
        for side in sides:
            r, peak = run[side]()
            rates[side].append(r)
            rss[side].append(peak)
            print(f"  round {i + 1}: {side:9s} {r:9.0f} examples/s, peak RSS {peak:6.0f} MiB", flush=True)
    best = {s: max(rates[s]) for s in sides}
    print()
    print(f"single-process MLP 784-1024-1024-10, batch 256, Adam, float32, {args.device} "
          f"({os.cpu_count()} cores), {args.steps} timed steps after {args.warmup} warm-up")
    print(f"{'':12}{'examples/s':>12}{'peak RSS MiB':>14}")
    for s in sides:
        print(f"{s:12}{best[s]:12.0f}{max(rss[s]):14.0f}")
    figures = {"device": args.device}
    for s in sides:
        figures[f"{s}_examples_per_s"] = rates[s]
        figures[f"{s}_rss_mib"] = rss[s]
    for peer in [s for s in sides if s != "distrain"]:
        ratio = best["distrain"] / best[peer]
        figures[f"distrain_over_{peer}"] = ratio
        print(f"ratio distrain/{peer}: {ratio:.2f}x examples/s, "
              f"{max(rss['distrain']) / max(rss[peer]):.2f}x RSS")
    print(f"uptime: {uptime()}")
    if not args.no_record:
        append_record("single_process_throughput", figures, load_before,
                      {"steps": args.steps, "warmup": args.warmup, "sides": sides})


if __name__ == "__main__":
    main()
