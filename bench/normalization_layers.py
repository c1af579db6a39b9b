#!/usr/bin/env python3
"""The normalisation layers' cost in training: distrain vs TensorFlow Keras, same run.

One model per normalisation, on real MNIST (scripts/mnist.sh), batch 256, Adam:
  Conv2D(32, 3x3) -> <norm> -> ReLU -> MaxPooling2D -> Flatten -> Dense(10),
<norm> one of BatchNormalization, LayerNormalization, RMSNormalization, or
none (a linear Activation: the model without a normalisation, the baseline
both sides' normalisation cost is read against). The normalisation runs over
the 26x26x32 feature map: 173,056 rows of 32 channels per batch for the
per-example layers, 32 channels over 173,056 positions for BatchNormalization.
  (a) distrain: `build/cli/distrain run` of a generated OneDevice job;
      examples/s is the worker's last logging interval (after
      `--warmup` steps, so start-up and the first steps are excluded);
  (b) TensorFlow Keras (tensorflow-cpu in ~/.cache/distrain/peers-venv,
      oneDNN on): model.fit over the same digits after a one-epoch warm-up,
      examples/s of the timed epochs.
Runs alternate (distrain, TF, distrain, TF, ...) per layer; the best of
`--repeats` per side, and the ratio distrain / TF, are printed and appended
to bench/records/normalization_layers.jsonl with `uptime` before and after.

  bench/normalization_layers.py [--steps 150] [--repeats 2] [--no-record]
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib  # noqa: E402

ROOT = benchlib.ROOT
BUILD = benchlib.BUILD
PEERS_PYTHON = benchlib.PEERS_PY
LAYERS = {
    "BatchNormalization": "BatchNormalization: {}",
    "LayerNormalization": "LayerNormalization: {}",
    "RMSNormalization": "RMSNormalization: {}",
    "none": "Activation: {activation: linear}",
}
BATCH = 256

JOB = """apiVersion: distrain.io/v1alpha1
kind: DistributedTrainingJob
metadata: {{name: normalization-bench}}
spec:
  strategy: OneDevice
  replicaSpecs: {{Worker: {{replicas: 1}}}}
  training:
    model:
      layers:
        - Conv2D: {{filters: 32, kernelSize: [3, 3]}}
        - {norm}
        - Activation: {{activation: relu}}
        - MaxPooling2D: {{}}
        - Flatten: {{}}
        - Dense: {{units: 10}}
      loss: {{fromLogits: true}}
    optimizer: {{type: adam, learningRate: 0.001}}
    dataset:
      type: idx
      trainFiles: [{data}/train-images-idx3-ubyte]
      trainLabelFiles: [{data}/train-labels-idx1-ubyte]
      numClasses: 10
    globalBatchSize: {batch}
    steps: {steps}
    logEverySteps: {interval}
"""

TF_SCRIPT = r"""
import os, sys, time
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
import numpy as np
import keras
d, name, steps, batch = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
x = (np.fromfile(f"{d}/train-images-idx3-ubyte", dtype=np.uint8)[16:]
     .reshape(-1, 28, 28, 1).astype("float32") / 255)
y = np.fromfile(f"{d}/train-labels-idx1-ubyte", dtype=np.uint8)[8:].astype("int32")
norm = {"BatchNormalization": keras.layers.BatchNormalization,
        "LayerNormalization": keras.layers.LayerNormalization,
        "RMSNormalization": keras.layers.RMSNormalization,
        "none": lambda: keras.layers.Activation("linear")}[name]
keras.utils.set_random_seed(1)
model = keras.Sequential([keras.Input((28, 28, 1)), keras.layers.Conv2D(32, 3), norm(),
                          keras.layers.Activation("relu"), keras.layers.MaxPooling2D(),
                          keras.layers.Flatten(), keras.layers.Dense(10)])
model.compile(optimizer=keras.optimizers.Adam(0.001),
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
per_epoch = len(x) // batch
model.fit(x[:per_epoch * batch], y[:per_epoch * batch], batch_size=batch, epochs=1, verbose=0)
epochs = max(1, steps // per_epoch)
start = time.perf_counter()
model.fit(x[:per_epoch * batch], y[:per_epoch * batch], batch_size=batch, epochs=epochs,
          verbose=0)
print("EXAMPLES_PER_S", epochs * per_epoch * batch / (time.perf_counter() - start))
"""


def run_distrain(norm, steps, work):
    interval = steps // 3
    job = os.path.join(work, "job.yaml")
    with open(job, "w") as f:
        f.write(JOB.format(norm=LAYERS[norm], data=os.path.join(ROOT, "data", "mnist"),
                           batch=BATCH, steps=steps, interval=interval))
    # A fresh work directory: a checkpoint left by the last run would resume.
    out = subprocess.run([os.path.join(BUILD, "cli", "distrain"), "run", job, "--no-progress",
                          "--work-dir", tempfile.mkdtemp(dir=work)],
                         capture_output=True, text=True, timeout=900)
    if out.returncode != 0:
        benchlib.fail(f"distrain run failed for {norm}:\n{out.stdout}{out.stderr}")
    m = re.search(r"examples/s\s+([0-9.]+) \(whole job, last interval\)", out.stdout + out.stderr)
    if not m:
        benchlib.fail(f"no examples/s in distrain's summary:\n{out.stdout}{out.stderr}")
    return float(m.group(1))


def run_tf(norm, steps, script):
    out = subprocess.run([PEERS_PYTHON, script, os.path.join(ROOT, "data", "mnist"), norm,
                          str(steps), str(BATCH)], capture_output=True, text=True, timeout=900)
    m = re.search(r"EXAMPLES_PER_S ([0-9.]+)", out.stdout)
    if out.returncode != 0 or not m:
        benchlib.fail(f"TensorFlow failed for {norm}:\n{out.stdout}{out.stderr}")
    return float(m.group(1))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--no-record", action="store_true")
    args = parser.parse_args()
    if not os.path.exists(os.path.join(ROOT, "data", "mnist", "train-images-idx3-ubyte")):
        benchlib.fail("no MNIST: run scripts/mnist.sh first")
    if not os.path.exists(PEERS_PYTHON):
        benchlib.fail(f"no TensorFlow peer at {PEERS_PYTHON}: run scripts/setup.sh")
    before = benchlib.uptime()
    print(f"uptime before: {before}")
    results = []
    with tempfile.TemporaryDirectory() as work:
        script = os.path.join(work, "tf_norm.py")
        with open(script, "w") as f:
            f.write(TF_SCRIPT)
        for norm in LAYERS:
            ours, theirs = [], []
            for _ in range(args.repeats):
                ours.append(run_distrain(norm, args.steps, work))
                theirs.append(run_tf(norm, args.steps, script))
            results.append({"layer": norm, "distrain_examples_per_s": max(ours),
                            "tf_examples_per_s": max(theirs),
                            "ratio_distrain_over_tf": max(ours) / max(theirs)})
            r = results[-1]
            print(f"{norm:20s} distrain {r['distrain_examples_per_s']:9.0f}  TF "
                  f"{r['tf_examples_per_s']:9.0f}  ratio {r['ratio_distrain_over_tf']:.2f}",
                  flush=True)
    base = {r["layer"]: r for r in results}["none"]
    for r in results:
        # The normalisation's own share of a step: 1 - (examples/s with it) /
        # (examples/s without it), on each side.
        r["distrain_norm_share_of_step"] = (
            1 - r["distrain_examples_per_s"] / base["distrain_examples_per_s"])
        r["tf_norm_share_of_step"] = 1 - r["tf_examples_per_s"] / base["tf_examples_per_s"]
    print(f"uptime after: {benchlib.uptime()}")
    if not args.no_record:
        headline = ", ".join(f"{r['layer']} {r['ratio_distrain_over_tf']:.2f}x TF"
                             for r in results)
        benchlib.append_record("normalization_layers", {"batch": BATCH, "steps": args.steps,
                                                        "layers": results},
                               before, extra={"headline": headline})


if __name__ == "__main__":
    main()
