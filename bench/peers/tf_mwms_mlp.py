#!/usr/bin/env python3
"""TensorFlow peer for bench/training_scaling.py: MultiWorkerMirroredStrategy training.

One process per worker; TF_CONFIG (set by the driver) names every worker on
127.0.0.1. Same model and data as the distrain side and as
bench/peers/tf_keras_mlp.py: MLP 784-1024-1024-10 (ReLU), sparse softmax
cross-entropy from logits, Adam lr 1e-3, float32, synthetic in-memory data,
`batch` examples per global step split evenly across the workers (TF's
MultiWorkerMirroredStrategy rebatches the global batch; the data is sharded
by example, AutoShardPolicy.DATA). Gradients are all-reduced with
CommunicationOptions(implementation=RING).

A custom training loop (TensorFlow's documented way for this strategy; Keras 3
`fit` does not accept MultiWorkerMirroredStrategy's distributed datasets):
strategy.run of a GradientTape step whose Keras optimizer all-reduces the
gradients, in a tf.function. `warmup` steps run first (tracing, collective
setup), then `steps` steps are timed. Worker 0 prints:
  RESULT {"examples_per_second": global examples/s, "workers": N}
"""
import argparse
import json
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=100)
ap.add_argument("--warmup", type=int, default=20)
ap.add_argument("--batch", type=int, default=256, help="global batch size")
ap.add_argument("--intra-op-threads", type=int, default=0,
                help="TensorFlow intra-op threads per process (0: TensorFlow's default)")
args = ap.parse_args()

if args.intra_op_threads > 0:
    tf.config.threading.set_intra_op_parallelism_threads(args.intra_op_threads)

tf_config = json.loads(os.environ["TF_CONFIG"])
rank = tf_config["task"]["index"]
workers = len(tf_config["cluster"]["worker"])
if args.batch % workers:
    raise SystemExit(f"tf_mwms_mlp: global batch {args.batch} does not split over {workers} workers")

options = tf.distribute.experimental.CommunicationOptions(
    implementation=tf.distribute.experimental.CommunicationImplementation.RING)
strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)

rng = np.random.default_rng(42)
n = 20000
centres = rng.normal(size=(10, 784)).astype(np.float32)
labels = rng.integers(0, 10, size=n).astype(np.int32)
features = centres[labels] + rng.normal(size=(n, 784)).astype(np.float32)

ds = tf.data.Dataset.from_tensor_slices((features, labels)).shuffle(n, seed=1).repeat() \
    .batch(args.batch, drop_remainder=True).prefetch(2)
ds_options = tf.data.Options()
ds_options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
ds = ds.with_options(ds_options)

with strategy.scope():
    model = tf.keras.Sequential([
        tf.keras.Input(shape=(784,)),
        tf.keras.layers.Dense(1024, activation="relu"),
        tf.keras.layers.Dense(1024, activation="relu"),
        tf.keras.layers.Dense(10),
    ])
    optimizer = tf.keras.optimizers.Adam(1e-3)
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(
        from_logits=True, reduction=None)
    optimizer.build(model.trainable_variables)


def replica_step(x, y):
    with tf.GradientTape() as tape:
        logits = model(x, training=True)
        loss = tf.nn.compute_average_loss(loss_fn(y, logits), global_batch_size=args.batch)
    grads = tape.gradient(loss, model.trainable_variables)
    # Keras' optimizer all-reduces (sums) the gradients across replicas here.
    optimizer.apply_gradients(zip(grads, model.trainable_variables))
    return loss


@tf.function
def train_step(iterator):
    x, y = next(iterator)
    per_replica_loss = strategy.run(replica_step, args=(x, y))
    return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica_loss, axis=None)


iterator = iter(strategy.experimental_distribute_dataset(ds))
for _ in range(args.warmup):
    loss = train_step(iterator)
float(loss)
start = time.perf_counter()
for _ in range(args.steps):
    loss = train_step(iterator)
loss = float(loss)  # waits for the last step
elapsed = time.perf_counter() - start
if not np.isfinite(loss):
    raise SystemExit(f"tf_mwms_mlp: worker {rank}: loss is {loss}")
if rank == 0:
    print("RESULT " + json.dumps({"examples_per_second": args.steps * args.batch / elapsed,
                                  "workers": workers, "loss": loss}), flush=True)
