#!/usr/bin/env python3
"""TensorFlow peer for bench/ps_training.py: ParameterServerStrategy training.

TensorFlow's own recipe for a local parameter-server cluster (the
"in-process cluster" of the ParameterServerStrategy tutorial): `workers`
worker and `ps` ps tf.distribute.Servers started in this process, talking
gRPC on 127.0.0.1; this process is the coordinator
(tf.distribute.coordinator.ClusterCoordinator).

Same model and data as the distrain side: MLP 784-1024-1024-10 (ReLU),
sparse softmax cross-entropy from logits, Adam lr 1e-3, float32, synthetic
in-memory data, `batch` examples per step closure on one worker. Variables
are created under the strategy's scope with
MinSizePartitioner(256 KiB, max_shards=ps), so the kernels are split over
every ps, as on the distrain side; Adam's slots are created right after their
variable with the same shape, so round-robin placement puts each slot shard
on its variable shard's ps, and the update is TensorFlow's fused
ResourceApplyAdam, which runs on the ps that holds the variable (what Keras 2
optimizers did under this strategy).

Each closure: the worker reads the variables from the ps tasks, computes
gradients on its next batch (per-worker dataset) and applies them
asynchronously. `warmup` closures run (and are joined) first: tracing,
connection set-up. Then `steps` closures are scheduled and joined, timed.
Prints:
  RESULT {"steps_per_second": ..., "examples_per_second": ..., "loss": ...}
"""
import argparse
import json
import os
import socket
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--workers", type=int, default=2)
ap.add_argument("--ps", type=int, default=2)
ap.add_argument("--steps", type=int, default=200, help="timed closures")
ap.add_argument("--warmup", type=int, default=20)
ap.add_argument("--batch", type=int, default=256, help="examples per closure")
ap.add_argument("--intra-op-threads", type=int, default=0,
                help="TensorFlow intra-op threads (0: TensorFlow's default)")
args = ap.parse_args()

if args.intra_op_threads > 0:
    tf.config.threading.set_intra_op_parallelism_threads(args.intra_op_threads)


def free_ports(n):
    socks = []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


ports = free_ports(args.workers + args.ps)
cluster = tf.train.ClusterSpec({
    "worker": [f"127.0.0.1:{p}" for p in ports[:args.workers]],
    "ps": [f"127.0.0.1:{p}" for p in ports[args.workers:]],
})
worker_config = tf.compat.v1.ConfigProto()
if (os.cpu_count() or 1) < args.workers + 1:
    # The tutorial's advice for a small machine: enough inter-op threads that
    # the in-process servers cannot starve each other.
    worker_config.inter_op_parallelism_threads = args.workers + 1
servers = [tf.distribute.Server(cluster, job_name="worker", task_index=i, config=worker_config,
                                protocol="grpc") for i in range(args.workers)]
servers += [tf.distribute.Server(cluster, job_name="ps", task_index=i, protocol="grpc")
            for i in range(args.ps)]
resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(cluster, rpc_layer="grpc")
strategy = tf.distribute.ParameterServerStrategy(
    resolver,
    variable_partitioner=tf.distribute.experimental.partitioners.MinSizePartitioner(
        min_shard_bytes=256 << 10, max_shards=args.ps))
coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)

LR, B1, B2, EPS = 1e-3, 0.9, 0.999, 1e-7
sizes = [784, 1024, 1024, 10]
init = np.random.default_rng(7)


def parts(v):
    # A partitioned variable is a ShardedVariable of row blocks.
    return list(v.variables) if hasattr(v, "variables") else [v]


with strategy.scope():
    params, slots = [], []  # slots: per variable, (m, v) per shard, on the shard's ps
    for fan_in, fan_out in zip(sizes[:-1], sizes[1:]):
        limit = np.sqrt(6.0 / (fan_in + fan_out))
        for value in (init.uniform(-limit, limit, size=(fan_in, fan_out)).astype(np.float32),
                      np.zeros(fan_out, np.float32)):
            params.append(tf.Variable(value))
            per_shard = []
            for part in parts(params[-1]):
                with strategy.extended.colocate_vars_with(part):
                    per_shard.append((tf.Variable(tf.zeros(part.shape)),
                                      tf.Variable(tf.zeros(part.shape))))
            slots.append(per_shard)
    iterations = tf.Variable(0.0)


def dataset_fn(*_):
    rng = np.random.default_rng(42)
    n = 20000
    centres = rng.normal(size=(10, 784)).astype(np.float32)
    labels = rng.integers(0, 10, size=n).astype(np.int32)
    features = centres[labels] + rng.normal(size=(n, 784)).astype(np.float32)
    return tf.data.Dataset.from_tensor_slices((features, labels)).shuffle(n, seed=1).repeat() \
        .batch(args.batch, drop_remainder=True).prefetch(2)


per_worker_iterator = iter(coordinator.create_per_worker_dataset(dataset_fn))


@tf.function
def step_fn(iterator):
    def replica_fn(x, y):
        shards = [parts(v) for v in params]
        with tf.GradientTape() as tape:
            tape.watch([s for ss in shards for s in ss])
            h = x
            whole = [tf.concat(ss, axis=0) if len(ss) > 1 else ss[0] for ss in shards]
            for i in range(0, len(whole), 2):
                h = tf.matmul(h, whole[i]) + whole[i + 1]
                if i + 2 < len(whole):
                    h = tf.nn.relu(h)
            loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=h))
        flat = [s for ss in shards for s in ss]
        grads = tape.gradient(loss, flat)
        t = iterations.assign_add(1.0)
        b1_power, b2_power = tf.pow(B1, t), tf.pow(B2, t)
        k = 0
        for v, per_shard in zip(params, slots):
            for w_part, (m_part, v_part) in zip(parts(v), per_shard):
                tf.raw_ops.ResourceApplyAdam(var=w_part.handle, m=m_part.handle, v=v_part.handle,
                                             beta1_power=b1_power, beta2_power=b2_power, lr=LR,
                                             beta1=B1, beta2=B2, epsilon=EPS, grad=grads[k])
                k += 1
        return loss

    x, y = next(iterator)
    return strategy.run(replica_fn, args=(x, y))


for _ in range(args.warmup):
    coordinator.schedule(step_fn, args=(per_worker_iterator,))
coordinator.join()
start = time.perf_counter()
result = None
for _ in range(args.steps):
    result = coordinator.schedule(step_fn, args=(per_worker_iterator,))
coordinator.join()
elapsed = time.perf_counter() - start
loss = float(result.fetch())
if not np.isfinite(loss):
    raise SystemExit(f"tf_ps_mlp: loss is {loss}")
print("RESULT " + json.dumps({"steps_per_second": args.steps / elapsed,
                              "examples_per_second": args.steps * args.batch / elapsed,
                              "workers": args.workers, "ps": args.ps, "loss": loss}), flush=True)
os._exit(0)  # the in-process servers never shut down on their own
