#!/usr/bin/env python3
"""Keras + tf.distribute.ParameterServerStrategy, driven by the operator's TF_CONFIG.

Every replica of a DistributedTrainingJob (strategy: ParameterServer) runs this
same script; TF_CONFIG's task says which role it plays:

  ps, worker  start TensorFlow's own gRPC server (tf.distribute.Server) on the
              task's TF_CONFIG port and serve until stopped: the ps tasks hold
              the variables, the workers run the steps the chief sends them.
              They never exit on their own; the operator deletes them once the
              job has succeeded (runPolicy.cleanPodPolicy, default Running).
  chief       the coordinator: builds the model under
              ParameterServerStrategy(cluster_resolver), whose variables are
              created on (and sharded over) the ps tasks, and trains with
              model.fit(DatasetCreator(dataset_fn), steps_per_epoch=...): each
              step is a closure the chief schedules on whichever worker is
              free. Exits 0 when training is done, which is the job's success.
  evaluator   not used by this example (a sidecar evaluator would read the
              chief's checkpoints); exits 0 at once.

TF_CONFIG as the operator writes it, for the chief of job "j" in namespace "ns":
  {"cluster": {"chief": ["j-chief-0.ns.svc:2222"],
               "worker": ["j-worker-0.ns.svc:2222", "j-worker-1.ns.svc:2222"],
               "ps": ["j-ps-0.ns.svc:2222"]},
   "task": {"type": "chief", "index": 0}, "environment": "cloud"}

Data: MNIST-shaped synthetic digits (mnist_setup.py); every worker makes its
own shard of them in dataset_fn, by its input pipeline id. The chief leaves its
final step, loss and accuracy for the job's status (mnist_setup.report_final).

Output lines the e2e test checks (tests/e2e/tensorflow_image_test.sh):
  "tf-ps: ps 0 serving at HOST:PORT" / "tf-ps: worker 1 serving at HOST:PORT"
  "tf-ps: chief: 2 workers, 1 ps; variables on /job:ps/replica:0/task:0/device:CPU:0 (6)"
  "tf-ps: loss first epoch X last epoch Y (decreased)"
Exit code (chief) 0 when the loss decreased, 1 otherwise.

Locally: 4 processes with hand-written TF_CONFIG as in mnist_mwms.py, or with
the TF_CONFIG the operator would write (the ps and worker servers never exit,
so --grace-period bounds how long `distrain run` waits for them afterwards):
  distrain run examples/tensorflow-parameter-server.yaml --worker-binary examples/tensorflow/mnist_ps.py --grace-period 5
"""

import collections
import json
import os
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")  # TensorFlow's INFO lines off
# Keras 2 (the tf-keras package) as tf.keras: model.fit under
# ParameterServerStrategy (DatasetCreator, ClusterCoordinator) is Keras 2's;
# Keras 3 has no ParameterServerStrategy support.
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
import tensorflow as tf  # noqa: E402

from mnist_setup import build_model, exit_on_sigterm, make_dataset, parse_training_args, report_final  # noqa: E402


def log(msg):
    print(f"tf-ps: {msg}", flush=True)



def serve(resolver):
    server = tf.distribute.Server(resolver.cluster_spec(), job_name=resolver.task_type,
                                  task_index=resolver.task_id,
                                  protocol=resolver.rpc_layer or "grpc", start=True)
    address = resolver.cluster_spec().task_address(resolver.task_type, resolver.task_id)
    log(f"{resolver.task_type} {resolver.task_id} serving at {address} ({server.target})")
    # server.join() blocks inside TensorFlow, where no Python signal handler
    # runs; sleeping here lets SIGTERM end the process at once.
    while True:
        time.sleep(3600)


def coordinate(resolver, args):
    cluster = resolver.cluster_spec()
    num_workers, num_ps = cluster.num_tasks("worker"), cluster.num_tasks("ps")
    t0 = time.time()
    # Variables larger than 256 KiB are split over the ps tasks.
    strategy = tf.distribute.ParameterServerStrategy(
        resolver,
        variable_partitioner=tf.distribute.experimental.partitioners.MinSizePartitioner(
            min_shard_bytes=256 << 10, max_shards=num_ps))
    log(f"connected to {num_workers} workers and {num_ps} ps in {time.time() - t0:.1f} s")

    def dataset_fn(input_context):
        batch = input_context.get_per_replica_batch_size(args.global_batch_size)
        return (make_dataset(args.examples)
                .shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
                .shuffle(args.examples, seed=input_context.input_pipeline_id)
                .repeat().batch(batch).prefetch(2))

    with strategy.scope():
        model = build_model()
        model.compile(optimizer=tf.keras.optimizers.Adam(1e-3),
                      loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"], steps_per_execution=5)
    # Where the variables live: on the ps tasks, not in this process.
    devices = collections.Counter()
    for v in model.variables:
        for shard in getattr(v, "variables", [v]):  # a ShardedVariable's parts
            devices[shard.device] += 1
    placed = ", ".join(f"{d} ({n})" for d, n in sorted(devices.items()))
    log(f"chief: {num_workers} workers, {num_ps} ps; variables on {placed}")

    history = model.fit(tf.keras.utils.experimental.DatasetCreator(dataset_fn),
                        epochs=args.epochs, steps_per_epoch=args.steps_per_epoch, verbose=2)
    losses = history.history["loss"]
    log(f"trained {args.epochs} x {args.steps_per_epoch} steps on the workers in "
        f"{time.time() - t0:.1f} s, accuracy {history.history['accuracy'][-1]:.3f}")

    model_dir = args.model_dir or os.path.join(
        os.environ.get("DISTRAIN_CHECKPOINT_DIR") or tempfile.gettempdir(), "model")
    os.makedirs(model_dir, exist_ok=True)
    model.save(os.path.join(model_dir, "model.keras"))
    log(f"saved model to {os.path.join(model_dir, 'model.keras')}")
    report_final(args.epochs * args.steps_per_epoch, losses[-1], history.history["accuracy"][-1], log)

    decreased = losses[-1] < losses[0]
    log(f"loss first epoch {losses[0]:.4f} last epoch {losses[-1]:.4f} "
        f"({'decreased' if decreased else 'DID NOT DECREASE'})")
    return 0 if decreased else 1


def main():
    args = parse_training_args(__doc__.split("\n")[0])
    exit_on_sigterm()
    if not os.environ.get("TF_CONFIG"):
        log("TF_CONFIG is not set: this script needs a cluster (chief, worker and ps tasks)")
        return 3
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    log(f"task {resolver.task_type} {resolver.task_id}; cluster "
        f"{json.dumps(resolver.cluster_spec().as_dict(), sort_keys=True)}")
    if resolver.task_type in ("ps", "worker"):
        serve(resolver)
    if resolver.task_type == "evaluator":
        log("evaluator: nothing to do in this example")
        return 0
    return coordinate(resolver, args)


if __name__ == "__main__":
    sys.exit(main())
