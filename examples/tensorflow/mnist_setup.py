"""What mnist_mwms.py and mnist_ps.py share: the data, the model, and the two
things a script in a pod of the operator's should do besides training."""

import argparse
import json
import os
import signal

import numpy as np
import tensorflow as tf


def parse_training_args(description):
    """The knobs both scripts take, as flags or (from a pod template) env vars."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--epochs", type=int, default=int(os.environ.get("EPOCHS", "3")))
    p.add_argument("--steps-per-epoch", type=int, default=int(os.environ.get("STEPS_PER_EPOCH", "20")))
    p.add_argument("--global-batch-size", type=int, default=int(os.environ.get("GLOBAL_BATCH_SIZE", "64")))
    p.add_argument("--examples", type=int, default=4096, help="synthetic examples")
    p.add_argument("--model-dir", default=os.environ.get("MODEL_DIR", ""))
    return p.parse_args()


def make_dataset(num_examples, seed=7):
    """MNIST-shaped synthetic digits (28x28, 10 classes): one fixed template
    per class plus noise, from a fixed seed, so the image needs no download.
    Swap in tf.keras.datasets.mnist.load_data() or your own tf.data pipeline."""
    rng = np.random.default_rng(seed)
    templates = rng.uniform(0.0, 1.0, size=(10, 28, 28)).astype("float32")
    labels = rng.integers(0, 10, size=num_examples).astype("int64")
    images = templates[labels] + rng.normal(0.0, 0.6, size=(num_examples, 28, 28)).astype("float32")
    return tf.data.Dataset.from_tensor_slices((images[..., None], labels))


def build_model():
    return tf.keras.Sequential([
        tf.keras.Input(shape=(28, 28, 1)),
        tf.keras.layers.Conv2D(8, 3, activation="relu"),
        tf.keras.layers.MaxPooling2D(),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(32, activation="relu"),
        tf.keras.layers.Dense(10),
    ])


def exit_on_sigterm():
    """A container's main process is PID 1, which ignores SIGTERM unless it has
    a handler: without one, a pod the operator deletes (a ps or worker server
    after the job succeeded, a restart) waits out its whole grace period and
    is then SIGKILLed. The handler runs whenever Python has control (between
    steps, or in a sleep), so the servers must wait in Python, not in
    server.join()."""
    signal.signal(signal.SIGTERM, lambda signum, frame: os._exit(128 + signum))


def report_final(step, loss, accuracy, log):
    """The chief's final figures for the job's status: the operator sets
    DISTRAIN_TERMINATION_MESSAGE_PATH (the container's terminationMessagePath),
    the kubelet keeps the file's content with the terminated pod, and the
    operator copies it into status.progress when the job succeeds
    (step, totalSteps, loss, accuracy, examplesPerSecond; all optional)."""
    path = os.environ.get("DISTRAIN_TERMINATION_MESSAGE_PATH")
    if not path:
        return
    try:
        with open(path, "w") as f:
            json.dump({"step": step, "totalSteps": step, "loss": float(loss),
                       "accuracy": float(accuracy)}, f)
    except OSError as e:
        log(f"cannot write the final figures to {path}: {e}")
