#!/usr/bin/env python3
"""Keras + tf.distribute.MultiWorkerMirroredStrategy, driven by the operator's TF_CONFIG.

Every replica of a DistributedTrainingJob (strategy: MultiWorkerMirrored) runs
this same script. The operator gives each pod TF_CONFIG in TensorFlow's shape,
e.g. for worker 1 of job "j" in namespace "ns":

  {"cluster": {"worker": ["j-worker-0.ns.svc:2222", "j-worker-1.ns.svc:2222"]},
   "task": {"type": "worker", "index": 1}, "environment": "cloud"}

MultiWorkerMirroredStrategy() reads it (TFConfigClusterResolver), starts this
task's gRPC server on its port and forms a collective group with the other
tasks: every step, the gradients are all-reduced across the replicas and
every replica applies the same update.

Data: MNIST-shaped synthetic digits (mnist_setup.py). Each worker makes the
whole dataset and it is sharded by example (DATA), so each replica trains on
its own 1/N of every global batch.

Saving: the chief (task "chief", or worker 0 without one) writes the model to
--model-dir (default $DISTRAIN_CHECKPOINT_DIR/model when the operator mounted
the job's checkpoint volume, else a temp dir); the other workers must take
part in saving too (it is a collective) and write to a temp dir they delete,
as TensorFlow's multi-worker guide says. The chief also leaves its final step,
loss and accuracy for the job's status (mnist_setup.report_final).

Output lines the e2e test checks (tests/e2e/tensorflow_image_test.sh):
  "tf-mwms: task worker 0 of 2, replicas in sync 2"
  "tf-mwms: loss first epoch X last epoch Y (decreased)"
  "tf-mwms: saved model to PATH"
Exit code 0 when the loss decreased, 1 otherwise.

Locally, without Kubernetes (two processes, hand-written TF_CONFIG):
  TF_CONFIG='{"cluster":{"worker":["localhost:12345","localhost:12346"]},"task":{"type":"worker","index":0}}' \
    python3 mnist_mwms.py &
  TF_CONFIG='{"cluster":{"worker":["localhost:12345","localhost:12346"]},"task":{"type":"worker","index":1}}' \
    python3 mnist_mwms.py
or with the distrain CLI, which writes TF_CONFIG as the operator does:
  distrain run examples/tensorflow-multi-worker-mirrored.yaml --worker-binary examples/tensorflow/mnist_mwms.py
"""

import json
import os
import shutil
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")  # TensorFlow's INFO lines off
# Keras 2 (the tf-keras package) as tf.keras: Keras 3's model.fit cannot run
# under MultiWorkerMirroredStrategy with more than one worker
# (keras-team/keras#20585), and TensorFlow's multi-worker guides use Keras 2.
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
import tensorflow as tf  # noqa: E402

from mnist_setup import build_model, exit_on_sigterm, make_dataset, parse_training_args, report_final  # noqa: E402


def log(msg):
    print(f"tf-mwms: {msg}", flush=True)



def main():
    args = parse_training_args(__doc__.split("\n")[0])
    exit_on_sigterm()
    tf_config = json.loads(os.environ.get("TF_CONFIG") or "{}")
    task = tf_config.get("task", {"type": "worker", "index": 0})
    cluster = tf_config.get("cluster", {})
    # Only chief and worker tasks train; the operator's TF_CONFIG may list an
    # evaluator, which MultiWorkerMirroredStrategy leaves out of the group.
    num_workers = len(cluster.get("chief", [])) + len(cluster.get("worker", []))
    is_chief = task["type"] == "chief" or (task["type"] == "worker" and task["index"] == 0
                                           and not cluster.get("chief"))

    # Before any other TensorFlow op: the strategy starts this task's server.
    t0 = time.time()
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    log(f"task {task['type']} {task['index']} of {max(num_workers, 1)}, "
        f"replicas in sync {strategy.num_replicas_in_sync}")

    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    dataset = (make_dataset(args.examples).shuffle(args.examples, seed=1).repeat()
               .batch(args.global_batch_size).with_options(options))

    with strategy.scope():
        model = build_model()
        model.compile(optimizer=tf.keras.optimizers.Adam(1e-3),
                      loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"])
    history = model.fit(dataset, epochs=args.epochs, steps_per_epoch=args.steps_per_epoch, verbose=2)
    losses = history.history["loss"]
    accuracy = history.history["accuracy"][-1]
    log(f"trained {args.epochs} x {args.steps_per_epoch} steps in {time.time() - t0:.1f} s, "
        f"accuracy {accuracy:.3f}")

    # Every worker saves (saving may run collective ops, which need them all,
    # as TensorFlow's multi-worker guide says); only the chief's copy stays.
    model_dir = args.model_dir or os.path.join(
        os.environ.get("DISTRAIN_CHECKPOINT_DIR") or tempfile.gettempdir(), "model")
    write_dir = model_dir if is_chief else tempfile.mkdtemp(prefix="mwms-worker-")
    os.makedirs(write_dir, exist_ok=True)
    model.save(os.path.join(write_dir, "model.keras"))
    if is_chief:
        log(f"saved model to {os.path.join(write_dir, 'model.keras')}")
        report_final(args.epochs * args.steps_per_epoch, losses[-1], accuracy, log)
    else:
        shutil.rmtree(write_dir, ignore_errors=True)

    decreased = losses[-1] < losses[0]
    log(f"loss first epoch {losses[0]:.4f} last epoch {losses[-1]:.4f} "
        f"({'decreased' if decreased else 'DID NOT DECREASE'})")
    return 0 if decreased else 1


if __name__ == "__main__":
    sys.exit(main())
