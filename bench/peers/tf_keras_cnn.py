#!/usr/bin/env python3
"""TensorFlow Keras peer for bench/cnn_training.py: the CNN of TensorFlow's
distributed-training guide, trained with model.fit on MNIST IDX files.

  Conv2D(32, 3x3, relu) -> MaxPooling2D(2x2) -> Conv2D(64, 3x3, relu) ->
  Flatten -> Dense(64, relu) -> Dense(10, softmax)
  compile(Adam(lr), SparseCategoricalCrossentropy(from_logits=True),
          [SparseCategoricalAccuracy()])

from_logits=True on a softmax output is the guide's own quirk (Keras warns
about it); it is kept so both sides train the same function. Pixels are
scaled by 1/255. The input pipeline reshuffles the whole training split every
epoch and batches across epoch boundaries (like distrain's batcher), cached in
memory. Times the steps after `warmup`: wall time from the start of batch
`warmup` to the end of the last batch (one interval, not a mean of rates).
Then evaluates on the test files and prints one line:
  RESULT {"examples_per_second": ..., "timed_steps": ..., "seconds": ...,
          "test_accuracy": ..., "test_loss": ..., "mean_train_loss": ...}
"""
import json
import os
import time

import cnn_peer_args

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402


def read_idx(path, ndims):
    dims, payload = cnn_peer_args.read_idx(path, ndims)
    return np.frombuffer(payload, np.uint8).reshape(dims)


args = cnn_peer_args.parse_args()

tf.keras.utils.set_random_seed(args.seed)
# Keras' own mixed precision: every layer computes in the 16-bit type, and
# compile() wraps the optimizer in a LossScaleOptimizer for mixed_float16.
tf.keras.mixed_precision.set_global_policy(args.precision)
x_train = (read_idx(args.train_images, 3).astype(np.float32) / 255.0)[..., None]
y_train = read_idx(args.train_labels, 1).astype(np.int32)
x_test = (read_idx(args.test_images, 3).astype(np.float32) / 255.0)[..., None]
y_test = read_idx(args.test_labels, 1).astype(np.int32)

model = tf.keras.Sequential([
    tf.keras.layers.Conv2D(32, (3, 3), activation="relu", input_shape=(28, 28, 1)),
    tf.keras.layers.MaxPooling2D((2, 2)),
    tf.keras.layers.Conv2D(64, (3, 3), activation="relu"),
    tf.keras.layers.Flatten(),
    tf.keras.layers.Dense(64, activation="relu"),
    tf.keras.layers.Dense(10, activation="softmax"),
])
model.compile(optimizer=tf.keras.optimizers.Adam(learning_rate=args.lr),
              loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
              metrics=[tf.keras.metrics.SparseCategoricalAccuracy()])

train = tf.data.Dataset.from_tensor_slices((x_train, y_train)).cache() \
    .shuffle(len(y_train), seed=args.seed, reshuffle_each_iteration=True).repeat() \
    .batch(args.batch).prefetch(2)
total = args.warmup + args.steps


class Timer(tf.keras.callbacks.Callback):
    def on_train_batch_begin(self, batch, logs=None):
        if batch == args.warmup:
            self.start = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        if batch == total - 1:
            self.end = time.perf_counter()


timer = Timer()
history = model.fit(train, steps_per_epoch=total, epochs=1, verbose=0, callbacks=[timer])
seconds = timer.end - timer.start
test_loss, test_accuracy = model.evaluate(x_test, y_test, batch_size=500, verbose=0)
print("RESULT " + json.dumps({
    "examples_per_second": args.steps * args.batch / seconds,
    "timed_steps": args.steps, "seconds": seconds,
    "test_accuracy": float(test_accuracy), "test_loss": float(test_loss),
    "mean_train_loss": float(history.history["loss"][-1]),  # over the whole run
    "tensorflow": tf.__version__,
}), flush=True)
