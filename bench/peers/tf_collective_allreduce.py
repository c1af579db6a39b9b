#!/usr/bin/env python3
"""TensorFlow peer for bench/allreduce_busbw.py: collective all-reduce, float32, SUM.

One process per rank; TF_CONFIG (set by the driver) names every worker on
127.0.0.1. Uses tf.distribute.MultiWorkerMirroredStrategy with
CommunicationOptions(implementation=RING): the all-reduce is the one a Keras
or custom training loop runs on gradients, i.e.
ReplicaContext.all_reduce(SUM, t) inside strategy.run inside a tf.function
(TF lowers it to CollectiveReduceV2 with the ring implementation over its gRPC
worker service).

Same protocol as the distrain side (peer_protocol.py). TF's all-reduce is
out of place (the input tensor is not modified), so the input stays the same
for every call.

Rank 0 prints one line per size:
  RESULT {"side": "tf", "ranks": N, "bytes": B, "iters": K, "median_s": T, "mean_s": T}
Exit 1 (with a message) when a result is wrong.
"""
import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from peer_protocol import iterations_wanted, parse_args, print_result  # noqa: E402

args = parse_args()

tf_config = json.loads(os.environ["TF_CONFIG"])
rank = tf_config["task"]["index"]
world = len(tf_config["cluster"]["worker"])

options = tf.distribute.experimental.CommunicationOptions(
    implementation=tf.distribute.experimental.CommunicationImplementation.RING,
    timeout_seconds=args.timeout_seconds)
strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
if strategy.num_replicas_in_sync != world:
    sys.exit(f"tf_collective_allreduce: {strategy.num_replicas_in_sync} replicas in sync, "
             f"expected {world} (one CPU replica per worker)")


def replica_all_reduce(t):
    # identity() places the tensor on the replica's device, as a gradient
    # computed in the replica function is (a function argument has no device,
    # and the collective needs one); on CPU it does not copy.
    return tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, tf.identity(t))


@tf.function
def all_reduce(t):
    return strategy.run(replica_all_reduce, args=(t,))


def local(result):
    # One replica per worker: the per-replica result is this worker's tensor.
    return strategy.experimental_local_results(result)[0]


for size_bytes in (int(s) for s in args.sizes.split(",")):
    count = size_bytes // 4
    # int32 is exact here (7 * 64 Mi elements < 2^31) and halves the memory at 256 MiB.
    idx = np.arange(count, dtype=np.int32)
    x = tf.constant(((7 * idx + 3 * rank) % 11).astype(np.float32))

    # 1. Correctness.
    got = local(all_reduce(x)).numpy()
    want = np.zeros(count, dtype=np.float32)
    for r in range(world):
        want += (7 * idx + 3 * r) % 11
    if not np.array_equal(got, want):
        bad = np.flatnonzero(got != want)
        sys.exit(f"tf_collective_allreduce: rank {rank}: {bad.size} of {count} elements wrong "
                 f"(first at {bad[0]}: {got[bad[0]]} != {want[bad[0]]})")
    del idx, want, got

    # 2. Warm-up; rank 0 picks the iteration count.
    t0 = time.perf_counter()
    for _ in range(args.warmup):
        local(all_reduce(x))
    iters = iterations_wanted((time.perf_counter() - t0) / max(args.warmup, 1), args)
    share = tf.constant([float(iters) if rank == 0 else 0.0])
    iters = int(local(all_reduce(share)).numpy()[0])

    # 3. Timed: the call returns once the CPU collective has finished.
    times = []
    for _ in range(iters):
        a = time.perf_counter()
        local(all_reduce(x))
        times.append(time.perf_counter() - a)
    if rank == 0:
        print_result("tf", world, size_bytes, times)
