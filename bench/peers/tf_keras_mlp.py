#!/usr/bin/env python3
"""TensorFlow Keras peer for bench/single_process_throughput.py.

Same model (MLP 784-1024-1024-10, ReLU, sparse softmax cross-entropy from
logits), Adam lr 1e-3, batch 256, float32, in-memory data. Times `steps`
batches after `warmup` batches (tracing and the first steps excluded) and
prints: RESULT {"examples_per_second": ...}
"""
import argparse
import json
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=200)
ap.add_argument("--warmup", type=int, default=40)
ap.add_argument("--batch", type=int, default=256)
args = ap.parse_args()

rng = np.random.default_rng(42)
n = 20000
centres = rng.normal(size=(10, 784)).astype(np.float32)
labels = rng.integers(0, 10, size=n).astype(np.int32)
features = centres[labels] + rng.normal(size=(n, 784)).astype(np.float32)

model = tf.keras.Sequential([
    tf.keras.Input(shape=(784,)),
    tf.keras.layers.Dense(1024, activation="relu"),
    tf.keras.layers.Dense(1024, activation="relu"),
    tf.keras.layers.Dense(10),
])
model.compile(optimizer=tf.keras.optimizers.Adam(1e-3),
              loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))

ds = tf.data.Dataset.from_tensor_slices((features, labels)).shuffle(n, seed=1).repeat() \
    .batch(args.batch, drop_remainder=True).prefetch(2)


class Timer(tf.keras.callbacks.Callback):
    def on_train_batch_begin(self, batch, logs=None):
        if batch == args.warmup:
            self.start = time.perf_counter()

    def on_train_end(self, logs=None):
        self.elapsed = time.perf_counter() - self.start


timer = Timer()
model.fit(ds, steps_per_epoch=args.warmup + args.steps, epochs=1, verbose=0, callbacks=[timer])
print("RESULT " + json.dumps({"examples_per_second": args.steps * args.batch / timer.elapsed}))
