#!/usr/bin/env python3
"""CNN training on real MNIST: distrain vs TensorFlow Keras and PyTorch, same run, same data.

The CNN of TensorFlow's distributed-training guide,
  Conv2D(32, 3x3, relu) -> MaxPooling2D(2x2) -> Conv2D(64, 3x3, relu) ->
  Flatten -> Dense(64, relu) -> Dense(10, softmax),
  Adam lr 0.001, SparseCategoricalCrossentropy(from_logits=True) (the guide's quirk),
trained on the IDX files of scripts/mnist.sh (8,000 train / 2,000 test digits)
  (a) by TensorFlow Keras model.fit (bench/peers/tf_keras_cnn.py, tensorflow-cpu
      in ~/.cache/distrain/peers-venv, oneDNN on), and
  (b) by PyTorch eager (side `torch`, bench/peers/torch_cnn.py: the same model,
      initialisers, Adam and loss in a plain training loop; torch from
      bench/peers/setup_torch.sh's venv, or $DISTRAIN_TORCH_PYTHON), and
  (c) by `build/cli/distrain run` on a generated job YAML: side `distrain` is
      OneDevice (one replica; oneDNN and OpenBLAS share the cores inside each
      op), side `mirrored` is Mirrored with one replica per core (the batch
      split over threads, one core each, gradients all-reduced in process) —
      the same model, data, global batch, optimizer and steps,
On a GPU (`--device gpu`: a CUDA build that sees one, and torch with CUDA)
distrain's OneDevice and Mirrored place their replicas on the visible GPUs
and PyTorch runs on cuda:0; TensorFlow (tensorflow-cpu) is left out, and so
are the FP32-peak fractions, which describe the CPU.
All sides use the same global batch (64 and 256), the same number of steps (`--epochs`
passes over the training split) and the same warm-up. Per run:
  * examples/s: wall time from the end of warm-up step `warmup` to the end of
    the last step, one interval (TF: Keras batch callbacks; distrain: the
    worker's millisecond log timestamps of `step <warmup>/...` and the last
    `step N/N` line), timed steps x batch / that time;
  * peak RSS: wait4's ru_maxrss (for `distrain run` the largest of it and its
    worker, i.e. the worker; for TF the Python process);
  * test accuracy on the 2,000 test digits after training.
Runs alternate (distrain, TF, distrain, TF, ...). Reports the best examples/s
of each side, the ratio, the RSS ratio, the accuracy gap (mean of the repeats),
and the fraction of the machine's FP32 peak distrain reaches: FLOPs per example
counted from the layer shapes (multiply-adds x 2, forward + both backward
products, no input gradient for the first layer; elementwise work, pooling and
Adam left out, so the fraction is a lower bound), against the FP32 peak: the
FMA throughput of one core measured here (a small compiled kernel, best of 3;
one thread so that a busy neighbour core does not halve it) times the cores,
and the nominal peak (cores x FLOP/cycle x TSC clock) for reference. Appends one JSON line to
bench/records/cnn_training.jsonl and records `uptime` before and after.

  bench/cnn_training.py [--batches 64,256] [--epochs 8] [--repeats 2] [--sides distrain,mirrored,tf,torch]
                       [--device cpu|gpu] [--precision float32|mixed_bfloat16|mixed_float16]
                       [--no-record]
`--precision` trains every side under that mixed-precision policy (distrain:
spec.training.precision; TF: Keras' global policy; PyTorch: autocast, and a
GradScaler for float16).
"""
import argparse
import datetime
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from benchlib import BUILD, PEERS_PY, ROOT, cpu_info, torch_python, uptime

PEERS = ("tf", "torch")

RECORDS = os.path.join(ROOT, "bench", "records", "cnn_training.jsonl")

JOB = """apiVersion: distrain.io/v1alpha1
kind: DistributedTrainingJob
metadata: {{name: bench-cnn}}
spec:
  strategy: {strategy}
  replicaSpecs:
    Worker: {{replicas: 1}}
  training:
    localReplicas: {local_replicas}
    model:
      layers:
        - Conv2D: {{filters: 32, kernelSize: [3, 3], activation: relu}}
        - MaxPooling2D: {{poolSize: [2, 2]}}
        - Conv2D: {{filters: 64, kernelSize: [3, 3], activation: relu}}
        - Flatten: {{}}
        - Dense: {{units: 64, activation: relu}}
        - Dense: {{units: 10, activation: softmax}}
      loss: {{type: SparseCategoricalCrossentropy, fromLogits: true}}
    dataset:
      type: idx
      trainFiles: [{d}/train-images-idx3-ubyte]
      trainLabelFiles: [{d}/train-labels-idx1-ubyte]
      evalFiles: [{d}/t10k-images-idx3-ubyte]
      evalLabelFiles: [{d}/t10k-labels-idx1-ubyte]
      numClasses: 10
    optimizer: {{type: adam, learningRate: 0.001}}
    precision: {precision}
    globalBatchSize: {batch}
    steps: {steps}
    logEverySteps: {log_every}
    seed: {seed}
"""

# The guide CNN's layers for the FLOP count: (name, multiply-adds per example
# of the forward product, whether its input needs a gradient).
H1 = 28 - 2           # conv 3x3 valid: 26
P1 = H1 // 2          # pool 2x2: 13
H2 = P1 - 2           # conv 3x3 valid: 11
LAYER_MACS = [
    ("conv2d", H1 * H1 * 32 * 3 * 3 * 1, False),
    ("conv2d_1", H2 * H2 * 64 * 3 * 3 * 32, True),
    ("dense", H2 * H2 * 64 * 64, True),
    ("dense_1", 64 * 10, True),
]


def flops_per_example():
    forward = sum(m for _, m, _ in LAYER_MACS)
    backward = sum(m * (2 if needs_input_grad else 1) for _, m, needs_input_grad in LAYER_MACS)
    return 2 * forward, 2 * backward


# FP32 FMA throughput on every core at once: 16 independent accumulators per
# thread (enough to cover the FMA latency on current x86 cores), all in registers.
FMA_KERNEL = r"""
#include <immintrin.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#if defined(__AVX512F__)
typedef __m512 V;
#define SET1 _mm512_set1_ps
#define FMA _mm512_fmadd_ps
#define ADD _mm512_add_ps
#define LANES 16
static float sum(V v) { return _mm512_reduce_add_ps(v); }
#else
typedef __m256 V;
#define SET1 _mm256_set1_ps
#define FMA _mm256_fmadd_ps
#define ADD _mm256_add_ps
#define LANES 8
static float sum(V v) { float f[8]; _mm256_storeu_ps(f, v); float s = 0; for (int i = 0; i < 8; ++i) s += f[i]; return s; }
#endif
static long iters;
static volatile float sink;
static void* run(void* arg) {
  V a[16];
  for (int k = 0; k < 16; ++k) a[k] = SET1(1.0f + k * 1e-3f);
  const V m = SET1(0.9999f), c = SET1(1e-4f);
  for (long i = 0; i < iters; ++i) {
#pragma GCC unroll 16
    for (int k = 0; k < 16; ++k) a[k] = FMA(a[k], m, c);
  }
  V t = a[0];
  for (int k = 1; k < 16; ++k) t = ADD(t, a[k]);
  sink = sum(t);
  return arg;
}
int main(int argc, char** argv) {
  int threads = atoi(argv[1]);
  iters = atol(argv[2]);
  pthread_t t[256];
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (int i = 0; i < threads; ++i) pthread_create(&t[i], 0, run, 0);
  for (int i = 0; i < threads; ++i) pthread_join(t[i], 0);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  double s = (t1.tv_sec - t0.tv_sec) + 1e-9 * (t1.tv_nsec - t0.tv_nsec);
  printf("%.6e\n", (double)threads * iters * 16 * LANES * 2 / s);
  return 0;
}
"""


def measured_fp32_peak(info):
    """FLOP/s of the FMA kernel on one core (best of 3) x cores, or None without a C compiler."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None or info["isa"] == "SSE":
        return None
    with tempfile.TemporaryDirectory() as tmp:
        src, exe = os.path.join(tmp, "fma.c"), os.path.join(tmp, "fma")
        with open(src, "w") as f:
            f.write(FMA_KERNEL)
        arch = ["-mavx512f"] if info["isa"] == "AVX-512" else ["-mavx2", "-mfma"]
        subprocess.run([cc, "-O3", *arch, "-pthread", src, "-o", exe], check=True)
        best = 0.0
        for _ in range(3):
            out = subprocess.run([exe, "1", "100000000"], capture_output=True,
                                 text=True, check=True).stdout
            best = max(best, float(out))
        return best * info["cores"]


def nominal_fp32_peak(info):
    """cores x FP32 FLOP/cycle x TSC clock; FLOP/cycle from the ISA and, for AMD
    Zen 4 (family 25 with AVX-512: two 256-bit FMA pipes), the microarchitecture."""
    if info["isa"] == "AVX-512":
        per_cycle = 32 if info["family"] == 25 else 64   # Zen 4 double-pumps 512-bit FMAs
    elif info["isa"] == "AVX2":
        per_cycle = 32                                     # two 256-bit FMA pipes
    else:
        per_cycle = 8
    return info["cores"] * per_cycle * info["tsc_mhz"] * 1e6, per_cycle


def run_measured(cmd, env=None):
    """Runs cmd; returns (output, peak RSS MiB). Fails loudly on a non-zero exit."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True)
    out = proc.stdout.read()
    _, status, rusage = os.wait4(proc.pid, 0)
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        sys.exit(f"cnn_training: {cmd[0]} failed with exit code {code}:\n{out[-6000:]}")
    return out, rusage.ru_maxrss / 1024.0


def stamp(line):
    m = re.search(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+)Z", line)
    return datetime.datetime.fromisoformat(m.group(1)).timestamp() if m else None


def run_distrain(data_dir, batch, steps, warmup, seed, mirrored=False, device="cpu",
                 precision="float32"):
    with tempfile.TemporaryDirectory() as tmp:
        job = os.path.join(tmp, "job.yaml")
        with open(job, "w") as f:
            f.write(JOB.format(d=data_dir, batch=batch, steps=steps, log_every=warmup, seed=seed,
                               precision=precision,
                               strategy="Mirrored" if mirrored else "OneDevice",
                               # On GPUs localReplicas 0 is one replica per visible GPU.
                               local_replicas=os.cpu_count() if mirrored and device == "cpu" else 0))
        env = dict(os.environ)
        env.pop("TF_CONFIG", None)
        out, rss = run_measured([os.path.join(BUILD, "cli", "distrain"), "run", "--no-progress",
                                 "--work-dir", os.path.join(tmp, "work"), job], env)
    times = {}
    for line in out.splitlines():
        m = re.search(r" step (\d+)/(\d+) ", line)
        if m and stamp(line) is not None:
            times[int(m.group(1))] = stamp(line)
    if warmup not in times or steps not in times:
        sys.exit(f"cnn_training: no timestamped 'step {warmup}/' and 'step {steps}/' lines in:\n{out[-6000:]}")
    acc = re.search(r"eval_accuracy ([0-9.]+)", out)
    loss = re.search(r"training complete: steps \d+ loss ([0-9.]+)", out)
    seconds = times[steps] - times[warmup]
    return {"examples_per_second": (steps - warmup) * batch / seconds, "seconds": seconds,
            "test_accuracy": float(acc.group(1)) if acc else None,
            "final_train_loss": float(loss.group(1)) if loss else None, "peak_rss_mib": rss}


def run_peer_script(name, python, script, data_dir, batch, steps, warmup, seed, env, extra=()):
    out, rss = run_measured([python, os.path.join(ROOT, "bench", "peers", script),
                             "--train-images", f"{data_dir}/train-images-idx3-ubyte",
                             "--train-labels", f"{data_dir}/train-labels-idx1-ubyte",
                             "--test-images", f"{data_dir}/t10k-images-idx3-ubyte",
                             "--test-labels", f"{data_dir}/t10k-labels-idx1-ubyte",
                             "--batch", str(batch), "--steps", str(steps - warmup),
                             "--warmup", str(warmup), "--seed", str(seed), *extra], env)
    m = re.search(r"^RESULT (\{.*\})$", out, re.M)
    if not m:
        sys.exit(f"cnn_training: the {name} peer printed no RESULT line:\n{out[-6000:]}")
    result = json.loads(m.group(1))
    result["peak_rss_mib"] = rss
    return result


def run_torch(data_dir, batch, steps, warmup, seed, device="cpu", precision="float32"):
    env = dict(os.environ)
    env.pop("TF_CONFIG", None)
    return run_peer_script("PyTorch", torch_python(), "torch_cnn.py", data_dir, batch, steps, warmup,
                           seed, env, ["--device", "cuda" if device == "gpu" else "cpu",
                                       "--precision", precision])


def run_tf(data_dir, batch, steps, warmup, seed, device="cpu", precision="float32"):
    py = PEERS_PY if os.path.exists(PEERS_PY) else sys.executable
    env = dict(os.environ, TF_ENABLE_ONEDNN_OPTS="1")
    env.pop("TF_CONFIG", None)
    return run_peer_script("TensorFlow", py, "tf_keras_cnn.py", data_dir, batch, steps, warmup,
                           seed, env, ["--precision", precision])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", default="64,256", help="global batch sizes, comma-separated")
    ap.add_argument("--epochs", type=float, default=8, help="passes over the 8,000 training digits")
    ap.add_argument("--repeats", type=int, default=2, help="alternating distrain/TF rounds per batch")
    ap.add_argument("--sides", default="distrain,mirrored,tf",
                    help="which sides to run: distrain (OneDevice), mirrored (Mirrored, a replica per core "
                         "or GPU), tf, torch (installs torch on first use)")
    ap.add_argument("--device", choices=["cpu", "gpu"], default="cpu",
                    help="gpu: distrain on the visible GPUs (a CUDA build), PyTorch on cuda:0; no tf side")
    ap.add_argument("--seed", type=int, default=42, help="round r uses seed + r on both sides")
    ap.add_argument("--precision", default="float32",
                    choices=["float32", "mixed_bfloat16", "mixed_float16"],
                    help="spec.training.precision for distrain; Keras' global policy for TF; "
                         "autocast (+ GradScaler for float16) for PyTorch")
    ap.add_argument("--no-record", action="store_true", help="do not append to bench/records/")
    ap.add_argument("--note", default="", help="free text stored in the record (e.g. machine load)")
    args = ap.parse_args()
    sides = args.sides.split(",")
    if args.device == "gpu" and "tf" in sides:
        sys.exit("cnn_training: --device gpu has no tf side (the peers' TensorFlow is tensorflow-cpu)")

    load_before = uptime()
    print(f"uptime: {load_before}", flush=True)
    data_dir = subprocess.run(["bash", os.path.join(ROOT, "scripts", "mnist.sh")], capture_output=True,
                              text=True, check=True).stdout.strip().splitlines()[-1]
    with open(os.path.join(data_dir, "train-labels-idx1-ubyte"), "rb") as f:
        num_train = int.from_bytes(f.read(8)[4:], "big")
    info = cpu_info()
    fwd, bwd = flops_per_example()
    peak_measured = measured_fp32_peak(info)
    peak_nominal, per_cycle = nominal_fp32_peak(info)
    print(f"machine: {info['model']}, {info['cores']} cores, {info['isa']}; FP32 peak "
          f"{peak_nominal / 1e9:.0f} GFLOP/s nominal ({per_cycle} FLOP/cycle x {info['tsc_mhz']:.0f} MHz"
          f" x {info['cores']}), "
          + (f"{peak_measured / 1e9:.0f} GFLOP/s measured (FMA kernel: one core x {info['cores']})" if peak_measured else "not measured"))
    print(f"model: guide CNN, {(fwd + bwd) / 1e6:.2f} MFLOP per example (forward {fwd / 1e6:.2f}, "
          f"backward {bwd / 1e6:.2f})", flush=True)

    configs = []
    for batch in [int(b) for b in args.batches.split(",")]:
        steps = max(2, round(args.epochs * num_train / batch))
        warmup = 20 if batch <= 128 else 10
        # logEverySteps = warmup must hit the last step too.
        steps = (steps + warmup - 1) // warmup * warmup
        runs = {s: [] for s in sides}
        for r in range(args.repeats):
            for side in sides:
                fn = {"distrain": run_distrain, "tf": run_tf, "torch": run_torch,
                      "mirrored": lambda *a, **k: run_distrain(*a, mirrored=True, **k)}[side]
                # A different seed per round (the same for both sides): the
                # accuracy means then average over initialisations and orders.
                result = fn(data_dir, batch, steps, warmup, args.seed + r, device=args.device,
                            precision=args.precision)
                runs[side].append(result)
                acc = result["test_accuracy"]
                print(f"  batch {batch:4d} round {r + 1}: {side:9s} {result['examples_per_second']:8.0f} "
                      f"examples/s  peak RSS {result['peak_rss_mib']:6.0f} MiB  test accuracy "
                      + (f"{100 * acc:.2f}%" if acc is not None else "n/a"), flush=True)
        summary = {"batch": batch, "steps": steps, "warmup": warmup, "timed_steps": steps - warmup,
                   "epochs": steps * batch / num_train, "runs": runs}
        for side in sides:
            summary[side] = {
                "examples_per_second_best": max(x["examples_per_second"] for x in runs[side]),
                "examples_per_second_median": statistics.median(x["examples_per_second"] for x in runs[side]),
                "peak_rss_mib": max(x["peak_rss_mib"] for x in runs[side]),
                "test_accuracy_mean": (statistics.mean(x["test_accuracy"] for x in runs[side])
                                       if all(x["test_accuracy"] is not None for x in runs[side]) else None),
            }
        for side in sides:
            x = summary[side]
            x["gflops"] = x["examples_per_second_best"] * (fwd + bwd) / 1e9
            if args.device == "cpu":
                x["fraction_of_nominal_peak"] = x["gflops"] * 1e9 / peak_nominal
                if peak_measured:
                    x["fraction_of_measured_peak"] = x["gflops"] * 1e9 / peak_measured
        # Ratios of each distrain side over each peer: keys "<side_>ratio_..."
        # against TensorFlow (the records' first peer), "<side_>torch_ratio_..."
        # against PyTorch.
        for peer in [p for p in PEERS if p in sides]:
            t = summary[peer]
            for side in [s for s in sides if s not in PEERS]:
                d = summary[side]
                prefix = ("" if side == "distrain" else side + "_") + ("" if peer == "tf" else peer + "_")
                summary[prefix + "ratio_examples_per_second"] = (d["examples_per_second_best"] /
                                                                 t["examples_per_second_best"])
                summary[prefix + "ratio_peak_rss"] = d["peak_rss_mib"] / t["peak_rss_mib"]
                if d["test_accuracy_mean"] is not None and t["test_accuracy_mean"] is not None:
                    summary[prefix + "accuracy_gap_points"] = 100 * (d["test_accuracy_mean"] -
                                                                     t["test_accuracy_mean"])
        configs.append(summary)
    load_after = uptime()

    print()
    print(f"guide CNN on MNIST ({num_train} train / 2000 test digits), Adam 1e-3, {args.precision}, "
          f"on the {args.device}, "
          f"{args.epochs:g} epochs, best of {args.repeats} alternating rounds")
    peak = peak_measured or peak_nominal
    print(f"FP32 peak: {peak / 1e9:.0f} GFLOP/s " + ("(measured: one core's FMA rate x cores)" if peak_measured else
                                                    "(nominal, TSC clock)"))
    print(f"{'batch':>5} {'side':9} {'examples/s':>11} {'GFLOP/s':>8} {'of peak':>8} {'RSS MiB':>8} {'test acc':>9}")
    for c in configs:
        for side in sides:
            s = c[side]
            acc = s["test_accuracy_mean"]
            print(f"{c['batch']:5d} {side:9} {s['examples_per_second_best']:11.0f} {s['gflops']:8.1f} "
                  + (f"{100 * s['gflops'] * 1e9 / peak:7.1f}% " if args.device == "cpu" else "     n/a ")
                  + f"{s['peak_rss_mib']:8.0f} "
                  + (f"{100 * acc:8.2f}%" if acc is not None else "      n/a"))
        for peer in [p for p in PEERS if p in sides]:
            for side in [s for s in sides if s not in PEERS]:
                prefix = ("" if side == "distrain" else side + "_") + ("" if peer == "tf" else peer + "_")
                gap = c.get(prefix + "accuracy_gap_points")
                print(f"{c['batch']:5d} ratio {side}/{peer}: {c[prefix + 'ratio_examples_per_second']:.2f}x "
                      f"examples/s, {c[prefix + 'ratio_peak_rss']:.2f}x peak RSS, accuracy gap "
                      + (f"{gap:+.2f} points" if gap is not None else "n/a"))
    print(f"uptime before: {load_before}\nuptime after:  {load_after}")

    if not args.no_record:
        commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True).stdout.strip()
        record = {"benchmark": "cnn_training", "time": datetime.datetime.now(datetime.timezone.utc)
                  .isoformat(timespec="seconds"), "commit": commit, "machine": info,
                  "fp32_peak_gflops": {"nominal": peak_nominal / 1e9,
                                       "measured": peak_measured / 1e9 if peak_measured else None},
                  "mflop_per_example": {"forward": fwd / 1e6, "backward": bwd / 1e6},
                  "worker_binary_mtime": datetime.datetime.fromtimestamp(
                      os.path.getmtime(os.path.join(BUILD, "worker", "distrain-worker")),
                      datetime.timezone.utc).isoformat(timespec="seconds"),
                  "uptime_before": load_before, "uptime_after": load_after, "epochs": args.epochs,
                  "repeats": args.repeats, "seed": args.seed, "note": args.note, "device": args.device,
                  "precision": args.precision,
                  "sides": sides, "configs": configs}
        os.makedirs(os.path.dirname(RECORDS), exist_ok=True)
        with open(RECORDS, "a") as f:
            f.write(json.dumps(record) + "\n")
        print(f"record appended to {os.path.relpath(RECORDS, ROOT)}")


if __name__ == "__main__":
    main()
