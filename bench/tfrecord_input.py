#!/usr/bin/env python3
"""TFRecord input: the time to read the MNIST TFRecord shards (scripts/mnist_tfrecord.sh:
8,000 training digits in 4 GZIP shards, written by TensorFlow) into memory as float
images and integer labels, ready to batch.

Sides, alternating, each in its own process, median of --reps timed passes after one
warm-up pass:
  distrain  build/bench/tfrecord_input: worker/data/tfrecord_dataset.cc, what a worker runs
            (decompress, check both CRCs of every record, parse tf.train.Example, decode
            the raw uint8 image into floats x 1/255);
  tf        tf.data.TFRecordDataset(compression_type="GZIP", parallel reads) -> batch(1000)
            -> parse_example -> decode_raw -> cast x 1/255 (parallel map), gathered into
            numpy arrays: the same work in TensorFlow's own input pipeline, vectorised
            parsing (faster than parse_single_example per record).

  bench/tfrecord_input.py [--reps 7] [--rounds 2] [--no-record]

Appends one JSON line to bench/records/tfrecord_input.jsonl with the machine and
`uptime` before and after.
"""
import argparse
import datetime
import glob
import json
import os
import statistics
import subprocess
import sys

from benchlib import BUILD, PEERS_PY, ROOT, cpu_info, uptime

RECORDS = os.path.join(ROOT, "bench", "records", "tfrecord_input.jsonl")

TF_SIDE = r"""
import json, sys, time
import numpy as np
import tensorflow as tf
files, reps = sys.argv[2:], int(sys.argv[1])
def parse(records):  # a batch at once: TensorFlow's fastest idiom (vectorised parsing)
    f = tf.io.parse_example(records, {"image": tf.io.FixedLenFeature([], tf.string),
                                      "label": tf.io.FixedLenFeature([], tf.int64)})
    images = tf.reshape(tf.io.decode_raw(f["image"], tf.uint8), [-1, 28, 28, 1])
    return tf.cast(images, tf.float32) * (1.0 / 255), f["label"]
def load():
    ds = tf.data.TFRecordDataset(files, compression_type="GZIP",
                                 num_parallel_reads=tf.data.AUTOTUNE).batch(1000).map(
        parse, num_parallel_calls=tf.data.AUTOTUNE)
    xs, ys = [], []
    for x, y in ds:
        xs.append(x.numpy()); ys.append(y.numpy())
    return np.concatenate(xs), np.concatenate(ys)
ms = []
for rep in range(reps + 1):
    t0 = time.perf_counter()
    x, y = load()
    if rep > 0:
        ms.append((time.perf_counter() - t0) * 1000)
print(json.dumps({"examples": int(len(y)), "ms": ms}))
"""


def run_side(side, files, reps):
    if side == "distrain":
        cmd = [os.path.join(BUILD, "bench", "tfrecord_input"), "--compression", "GZIP",
               "--reps", str(reps)] + files
        env = None
    else:
        cmd = [PEERS_PY, "-c", TF_SIDE, str(reps)] + files
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="")
    out = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if out.returncode != 0:
        sys.exit(f"tfrecord_input: the {side} side failed:\n{out.stdout}\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=7, help="timed passes per side and round")
    ap.add_argument("--rounds", type=int, default=2, help="alternating distrain/tf rounds")
    ap.add_argument("--no-record", action="store_true", help="do not append to bench/records/")
    args = ap.parse_args()
    load_before = uptime()
    print(f"uptime: {load_before}", flush=True)
    data_dir = subprocess.run(["bash", os.path.join(ROOT, "scripts", "mnist_tfrecord.sh")],
                              capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1]
    files = sorted(glob.glob(os.path.join(data_dir, "train-*-of-*.tfrecord.gz")))
    if not files:
        sys.exit(f"tfrecord_input: no train shards in {data_dir}")
    ms = {"distrain": [], "tf": []}
    examples = {}
    for r in range(args.rounds):
        for side in ("distrain", "tf"):
            result = run_side(side, files, args.reps)
            ms[side] += result["ms"]
            examples[side] = result["examples"]
            print(f"round {r} {side:8s}: median {statistics.median(result['ms']):.1f} ms "
                  f"({result['examples']} examples)", flush=True)
    if examples["distrain"] != examples["tf"]:
        sys.exit(f"tfrecord_input: the sides read different counts: {examples}")
    med = {side: statistics.median(v) for side, v in ms.items()}
    ratio = med["tf"] / med["distrain"]
    load_after = uptime()
    print(f"\n{len(files)} GZIP shards, {examples['tf']} examples: distrain {med['distrain']:.1f} ms "
          f"({examples['tf'] / med['distrain'] * 1000:,.0f} examples/s), tf.data {med['tf']:.1f} ms "
          f"-> distrain {ratio:.2f}x faster")
    print(f"uptime: {load_after}")
    if not args.no_record:
        commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
                                capture_output=True, text=True).stdout.strip()
        with open(RECORDS, "a") as f:
            f.write(json.dumps({"benchmark": "tfrecord_input",
                                "time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                                "commit": commit, "machine": cpu_info(), "files": len(files),
                                "examples": examples["tf"], "median_ms": med, "tf_over_distrain": ratio,
                                "uptime_before": load_before, "uptime_after": load_after}) + "\n")


if __name__ == "__main__":
    main()
