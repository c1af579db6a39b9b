#!/usr/bin/env python3
"""Writes the Keras reference outputs that tests/unit/worker/model/golden_test.cc
checks distrain's layers, losses and models against.

Run with the peers virtualenv, which has tensorflow-cpu (Keras 3):
  /root/.cache/distrain/peers-venv/bin/python tests/golden/make_layer_goldens.py

Each case builds one Keras layer (or a small Sequential model) with fixed,
small weights and inputs, runs it, and records in tests/golden/layers.json:
  * the layer's config in distrain's terms (Keras class name and arguments),
  * the input and every variable, by Keras' variable name,
  * the output, and the gradients of L = sum(output * upstream) with respect
    to the input and every trainable variable (tf.GradientTape),
  * for BatchNormalization in training mode, the moving statistics after the
    call.
Model cases (losses, the guide CNN in small) record Keras' loss and accuracy
(model.evaluate), the loss and its gradients in a training call, and the
moving statistics after it. Values are float32 written with
9 significant digits, so they read back bit-exact.
"""

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")  # plain Eigen reference numbers

import warnings

import numpy as np
import tensorflow as tf
import keras

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "layers.json")
RNG = np.random.default_rng(20261125)


def arr(x):
    return [float("%.9g" % v) for v in np.asarray(x, dtype=np.float32).ravel()]


def small(shape, scale=1.0):
    return (RNG.uniform(-1.0, 1.0, size=shape) * scale).astype(np.float32)


def variables(layer):
    """Every variable by its distrain name suffix ("kernel", "moving_mean")."""
    return {v.path.split("/")[-1]: v for v in layer.weights}


def layer_case(name, config, layer, input_shape, training=False, input_scale=1.0,
               set_weights=None, distinct_input=False, ids_below=None):
    """Runs one layer on a fixed input and records output and gradients.
    ids_below: the input is whole-number token ids in [0, ids_below), held
    as floats, which have no gradient (Embedding)."""
    if ids_below is not None:
        x = RNG.integers(0, ids_below, size=(3,) + tuple(input_shape)).astype(np.float32)
        x.reshape(-1)[:2] = 1.0  # a repeated id at least once
    else:
        x = small((2,) + tuple(input_shape), input_scale)
    if distinct_input:
        # Distinct values far apart, so max pooling's argmax is unambiguous.
        n = x.size
        x = (RNG.permutation(n).astype(np.float32) / n * 2 - 1).reshape(x.shape)
    layer.build((None,) + tuple(input_shape))
    vs = variables(layer)
    if set_weights:
        set_weights(vs)
    else:
        for v in vs.values():
            v.assign(small(v.shape, 0.5))
    before = {k: v.numpy().copy() for k, v in vs.items()}
    xt = tf.constant(x)
    trainable = [v for v in layer.trainable_weights]
    with tf.GradientTape() as tape:
        tape.watch(xt)
        y = layer(xt, training=training)
        upstream = tf.constant(small(tuple(y.shape)))
        loss = tf.reduce_sum(y * upstream)
    grads = tape.gradient(loss, [xt] + trainable)
    case = {
        "name": name,
        "kind": "layer",
        "layer": config,
        "training": training,
        "input_shape": list(x.shape),
        "input": arr(x),
        "variables": {k: {"shape": list(v.shape), "value": arr(v)} for k, v in before.items()},
        "output_shape": list(y.shape),
        "output": arr(y),
        "upstream": arr(upstream),
        "grad_variables": {
            v.path.split("/")[-1]: arr(tf.convert_to_tensor(g))
            for v, g in zip(trainable, grads[1:])
        },
    }
    if ids_below is None:
        case["grad_input"] = arr(grads[0])
    if training and any(k.startswith("moving_") for k in vs):
        case["variables_after"] = {k: arr(v) for k, v in vs.items() if k.startswith("moving_")}
    return case


def layer_cases():
    cases = []
    K = keras.layers
    # Dense with every activation and without bias.
    for act in ["linear", "relu", "sigmoid", "tanh", "softmax", "gelu"]:
        cases.append(layer_case(
            f"dense_{act}", {"class": "Dense", "units": 3, "activation": act},
            K.Dense(3, activation=act, name="dense"), (4,), input_scale=2.0))
    cases.append(layer_case(
        "dense_no_bias", {"class": "Dense", "units": 3, "useBias": False},
        K.Dense(3, use_bias=False, name="dense"), (4,)))
    # Activation layers; wide inputs so sigmoid, tanh and gelu see their tails.
    for act in ["relu", "sigmoid", "tanh", "softmax", "gelu", "linear"]:
        cases.append(layer_case(
            f"activation_{act}", {"class": "Activation", "activation": act},
            K.Activation(act, name="activation"), (3, 5), input_scale=4.0))
    # Conv2D on odd sizes: padding x strides, non-square kernels and strides.
    for padding in ["valid", "same"]:
        for stride in [1, 2]:
            for (h, w), k in [((7, 7), (3, 3)), ((6, 5), (2, 3))]:
                cases.append(layer_case(
                    f"conv2d_{padding}_s{stride}_{h}x{w}_k{k[0]}{k[1]}",
                    {"class": "Conv2D", "filters": 3, "kernelSize": list(k),
                     "strides": [stride, stride], "padding": padding},
                    K.Conv2D(3, k, strides=stride, padding=padding, name="conv2d"),
                    (h, w, 2)))
    cases.append(layer_case(
        "conv2d_same_s21_relu_no_bias",
        {"class": "Conv2D", "filters": 4, "kernelSize": [3, 3], "strides": [2, 1],
         "padding": "same", "activation": "relu", "useBias": False},
        K.Conv2D(4, 3, strides=(2, 1), padding="same", activation="relu", use_bias=False,
                 name="conv2d"),
        (7, 6, 3)))
    # Pooling on odd sizes.
    for cls, kname in [(K.MaxPooling2D, "MaxPooling2D"), (K.AveragePooling2D, "AveragePooling2D")]:
        for padding in ["valid", "same"]:
            for pool, stride in [((2, 2), None), ((3, 3), (2, 2)), ((2, 3), (1, 1)),
                                 ((3, 3), (1, 2))]:
                cfg = {"class": kname, "poolSize": list(pool), "padding": padding}
                if stride:
                    cfg["strides"] = list(stride)
                s = "default" if stride is None else f"{stride[0]}{stride[1]}"
                cases.append(layer_case(
                    f"{kname.lower()}_{padding}_p{pool[0]}{pool[1]}_s{s}", cfg,
                    cls(pool, strides=stride, padding=padding, name="pool"), (7, 7, 2),
                    distinct_input=True))
    cases.append(layer_case(
        "global_average_pooling2d", {"class": "GlobalAveragePooling2D"},
        K.GlobalAveragePooling2D(name="gap"), (5, 3, 4)))
    cases.append(layer_case("flatten", {"class": "Flatten"}, K.Flatten(name="flatten"),
                            (3, 2, 2)))
    cases.append(layer_case("reshape", {"class": "Reshape", "targetShape": [2, -1]},
                            K.Reshape((2, -1), name="reshape"), (12,)))
    # Dropout at evaluation is the identity (the training masks use
    # distrain's own generator, tested separately).
    cases.append(layer_case("dropout_eval", {"class": "Dropout", "rate": 0.4},
                            K.Dropout(0.4, name="dropout"), (6,), training=False))

    def bn_weights(vs):
        c = vs["gamma"].shape[0]
        vs["gamma"].assign(1.0 + small((c,), 0.5))
        vs["beta"].assign(small((c,), 0.5))
        vs["moving_mean"].assign(small((c,), 0.5))
        vs["moving_variance"].assign(1.0 + small((c,), 0.5) ** 2)

    for training in [False, True]:
        mode = "train" if training else "infer"
        cases.append(layer_case(
            f"batchnorm_{mode}_images", {"class": "BatchNormalization", "momentum": 0.9,
                                         "epsilon": 1e-3},
            K.BatchNormalization(momentum=0.9, epsilon=1e-3, name="bn"), (3, 3, 4),
            training=training, input_scale=2.0, set_weights=bn_weights))
        cases.append(layer_case(
            f"batchnorm_{mode}_rows", {"class": "BatchNormalization"},
            K.BatchNormalization(name="bn"), (5,), training=training, input_scale=3.0,
            set_weights=bn_weights))
    return cases


LOSSES = {
    "SparseCategoricalCrossentropy": keras.losses.SparseCategoricalCrossentropy,
    "CategoricalCrossentropy": keras.losses.CategoricalCrossentropy,
    "BinaryCrossentropy": keras.losses.BinaryCrossentropy,
    "MeanSquaredError": keras.losses.MeanSquaredError,
}


def model_case(name, layer_configs, keras_layers, example_shape, loss_name, from_logits,
               num_classes, batch=6, input_scale=1.0, labels=None, weight_scale=0.5,
               ids_below=None):
    """A Sequential model: Keras' loss and accuracy and the loss's gradients.
    ids_below: the input is token ids in [0, ids_below) (an Embedding first)."""
    model = keras.Sequential([keras.Input(example_shape)] + keras_layers)
    loss_kwargs = {} if loss_name == "MeanSquaredError" else {"from_logits": from_logits}
    loss_fn = LOSSES[loss_name](**loss_kwargs)
    model.compile(optimizer="adam", loss=loss_fn, metrics=["accuracy"])
    for layer in model.layers:
        for v in layer.weights:
            suffix = v.path.split("/")[-1]
            if suffix in ("gamma", "moving_variance"):
                v.assign(1.0 + small(v.shape, weight_scale) ** 2)
            else:
                v.assign(small(v.shape, weight_scale))
    # Recorded before evaluate and the training call (which moves
    # BatchNormalization's statistics), under distrain's names, "<layer
    # name>/<variable>" (Keras' paths also carry the model's name).
    names = {}
    variables_out = {}
    for layer in model.layers:
        for v in layer.weights:
            names[id(v)] = f"{layer.name}/{v.path.split('/')[-1]}"
            variables_out[names[id(v)]] = {"shape": list(v.shape), "value": arr(v)}
    if ids_below is not None:
        x = RNG.integers(0, ids_below, size=(batch,) + tuple(example_shape)).astype(np.float32)
    else:
        x = small((batch,) + tuple(example_shape), input_scale)
    if labels is None:
        labels = RNG.integers(0, num_classes, size=(batch,))
    labels = np.asarray(labels, dtype=np.int32)
    width = model.outputs[0].shape[-1]
    # Keras' targets for each loss, as distrain derives them from the labels.
    if loss_name == "CategoricalCrossentropy" or (loss_name == "MeanSquaredError" and width > 1):
        y = np.eye(width, dtype=np.float32)[labels]
    elif loss_name in ("BinaryCrossentropy", "MeanSquaredError"):
        y = labels.astype(np.float32).reshape(-1, 1)
    else:
        y = labels
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loss, accuracy = model.evaluate(x, y, batch_size=batch, verbose=0)
        with tf.GradientTape() as tape:
            tape_loss = loss_fn(y, model(x, training=True))
    trainable = model.trainable_weights
    grads = tape.gradient(tape_loss, trainable)
    state_after = {names[id(v)]: arr(v) for layer in model.layers for v in layer.weights
                   if v.path.split("/")[-1].startswith("moving_")}
    return {
        "name": name,
        "kind": "model",
        "layers": layer_configs,
        "loss": {"type": loss_name, "fromLogits": from_logits},
        "num_classes": num_classes,
        "example_shape": list(example_shape),
        "input_shape": list(x.shape),
        "input": arr(x),
        "labels": [int(v) for v in labels],
        "variables": variables_out,
        "loss_value": float(loss),
        "tape_loss": float(tape_loss),
        "accuracy": float(accuracy),
        "grads": {names[id(v)]: arr(tf.convert_to_tensor(g)) for v, g in zip(trainable, grads)},
        "state_after_training_call": state_after,
        "keras_warned": any("from_logits=True" in str(w.message) for w in caught),
    }


def model_cases():
    cases = []
    K = keras.layers
    # Every loss x from_logits x output activation, on one Dense layer.
    for loss_name in LOSSES:
        binary = loss_name == "BinaryCrossentropy"
        for width in ([1] if binary else [4]) + ([1] if loss_name == "MeanSquaredError" else []):
            classes = 2 if width == 1 else width
            for act in ["linear", "softmax", "sigmoid"]:
                for from_logits in ([False] if loss_name == "MeanSquaredError" else [True, False]):
                    if act == "softmax" and width == 1 and not binary:
                        continue  # a constant output; nothing to learn from it
                    name = f"loss_{loss_name}_w{width}_{act}_logits{int(from_logits)}"
                    # Large inputs so probabilities hit Keras' clipping too.
                    for scale in [1.0, 8.0]:
                        cases.append(model_case(
                            f"{name}_x{int(scale)}",
                            [{"class": "Dense", "units": width, "activation": act,
                              "name": "dense"}],
                            [K.Dense(width, activation=act, name="dense")], (5,), loss_name,
                            from_logits, classes, input_scale=scale))
    # Activation(softmax) as its own last layer, the logits trick included.
    cases.append(model_case(
        "loss_sparse_activation_softmax_logits1",
        [{"class": "Dense", "units": 4, "name": "dense"},
         {"class": "Activation", "activation": "softmax", "name": "activation"}],
        [K.Dense(4, name="dense"), K.Activation("softmax", name="activation")], (5,),
        "SparseCategoricalCrossentropy", True, 4, input_scale=4.0))
    # Binary accuracy on logits between 0 and 0.5: Keras thresholds at 0.5.
    cases.append(model_case(
        "binary_accuracy_threshold_on_logits",
        [{"class": "Dense", "units": 1, "name": "dense"}], [K.Dense(1, name="dense")], (3,),
        "BinaryCrossentropy", True, 2, batch=8, input_scale=0.3))
    # TensorFlow's distributed-training guide CNN, shrunk to a 12x12 input so
    # the golden file stays small: Conv2D relu, MaxPooling2D, Conv2D relu,
    # Flatten, Dense relu, Dense softmax with from_logits=True (the guide's
    # setting: Keras warns and uses the logits).
    guide = [
        ({"class": "Conv2D", "filters": 4, "kernelSize": [3, 3], "activation": "relu",
          "name": "conv2d"}, K.Conv2D(4, (3, 3), activation="relu", name="conv2d")),
        ({"class": "MaxPooling2D", "poolSize": [2, 2], "name": "max_pooling2d"},
         K.MaxPooling2D((2, 2), name="max_pooling2d")),
        ({"class": "Conv2D", "filters": 8, "kernelSize": [3, 3], "activation": "relu",
          "name": "conv2d_1"}, K.Conv2D(8, (3, 3), activation="relu", name="conv2d_1")),
        ({"class": "Flatten", "name": "flatten"}, K.Flatten(name="flatten")),
        ({"class": "Dense", "units": 16, "activation": "relu", "name": "dense"},
         K.Dense(16, activation="relu", name="dense")),
        ({"class": "Dense", "units": 10, "activation": "softmax", "name": "dense_1"},
         K.Dense(10, activation="softmax", name="dense_1")),
    ]
    cases.append(model_case(
        "guide_cnn_small", [c for c, _ in guide], [l for _, l in guide], (12, 12, 1),
        "SparseCategoricalCrossentropy", True, 10, batch=4))
    # BatchNormalization and Dropout inside a model (training forward for the
    # gradients: Dropout rate 0 keeps it deterministic).
    bn = [
        ({"class": "Conv2D", "filters": 3, "kernelSize": [3, 3], "padding": "same",
          "strides": [2, 2], "name": "conv2d"},
         K.Conv2D(3, 3, padding="same", strides=2, name="conv2d")),
        ({"class": "BatchNormalization", "name": "batch_normalization"},
         K.BatchNormalization(name="batch_normalization")),
        ({"class": "Activation", "activation": "gelu", "name": "activation"},
         K.Activation("gelu", name="activation")),
        ({"class": "AveragePooling2D", "poolSize": [2, 2], "padding": "same",
          "name": "average_pooling2d"},
         K.AveragePooling2D(2, padding="same", name="average_pooling2d")),
        ({"class": "GlobalAveragePooling2D", "name": "global_average_pooling2d"},
         K.GlobalAveragePooling2D(name="global_average_pooling2d")),
        ({"class": "Dropout", "rate": 0.0, "name": "dropout"}, K.Dropout(0.0, name="dropout")),
        ({"class": "Dense", "units": 3, "activation": "softmax", "name": "dense"},
         K.Dense(3, activation="softmax", name="dense")),
    ]
    cases.append(model_case(
        "bn_gelu_pool_model", [c for c, _ in bn], [l for _, l in bn], (9, 7, 2),
        "SparseCategoricalCrossentropy", False, 3, batch=4, weight_scale=0.5))
    return cases


# Keras' other activations by name, and the layers that are one activation or
# an affine map. Drawn after every case above, so adding them left those
# cases' numbers as they were.
MORE_ACTIVATIONS = ["elu", "selu", "softplus", "softsign", "silu", "hard_sigmoid",
                    "hard_silu", "leaky_relu", "relu6", "exponential", "mish"]


def more_activation_cases():
    cases = []
    K = keras.layers
    for act in MORE_ACTIVATIONS:
        cases.append(layer_case(
            f"dense_{act}", {"class": "Dense", "units": 3, "activation": act},
            K.Dense(3, activation=act, name="dense"), (4,), input_scale=2.0))
        # Wide inputs: the saturating kinds (relu6, hard_sigmoid) reach both
        # ends, the exponential ones their tails.
        cases.append(layer_case(
            f"activation_{act}", {"class": "Activation", "activation": act},
            K.Activation(act, name="activation"), (3, 5), input_scale=8.0))
    # The aliases Keras accepts and writes back under the names above.
    for alias in ["swish", "hard_swish"]:
        cases.append(layer_case(
            f"activation_{alias}", {"class": "Activation", "activation": alias},
            K.Activation(alias, name="activation"), (3, 5), input_scale=4.0))
    cases.append(layer_case(
        "conv2d_same_silu", {"class": "Conv2D", "filters": 3, "kernelSize": [3, 3],
                             "padding": "same", "activation": "silu"},
        K.Conv2D(3, 3, padding="same", activation="silu", name="conv2d"), (5, 6, 2)))
    cases.append(layer_case(
        "conv2d_valid_leaky_relu", {"class": "Conv2D", "filters": 2, "kernelSize": [2, 2],
                                    "activation": "leaky_relu"},
        K.Conv2D(2, 2, activation="leaky_relu", name="conv2d"), (4, 4, 3)))
    for name, config, layer in [
            ("relu_layer", {"class": "ReLU"}, K.ReLU(name="re_lu")),
            ("relu_layer_max6", {"class": "ReLU", "maxValue": 6.0}, K.ReLU(max_value=6.0, name="re_lu")),
            ("relu_layer_slope", {"class": "ReLU", "negativeSlope": 0.1},
             K.ReLU(negative_slope=0.1, name="re_lu")),
            ("leaky_relu_layer", {"class": "LeakyReLU"}, K.LeakyReLU(name="leaky_re_lu")),
            ("leaky_relu_layer_02", {"class": "LeakyReLU", "negativeSlope": 0.02},
             K.LeakyReLU(negative_slope=0.02, name="leaky_re_lu")),
            ("elu_layer", {"class": "ELU"}, K.ELU(name="elu")),
            ("elu_layer_alpha", {"class": "ELU", "alpha": 0.5}, K.ELU(alpha=0.5, name="elu")),
            ("softmax_layer", {"class": "Softmax"}, K.Softmax(name="softmax")),
            ("softmax_layer_axis2", {"class": "Softmax", "axis": 2},
             K.Softmax(axis=2, name="softmax")),
            ("rescaling_layer", {"class": "Rescaling", "scale": 1.0 / 127.5, "offset": -1.0},
             K.Rescaling(1.0 / 127.5, offset=-1.0, name="rescaling"))]:
        scale = 100.0 if config["class"] == "Rescaling" else 8.0
        cases.append(layer_case(name, config, layer, (3, 5), input_scale=scale))
    # A model ending in a Softmax layer (the logits trick, Keras' warning), with
    # Rescaling in front and SELU / ELU between.
    model = [
        ({"class": "Rescaling", "scale": 0.05, "name": "rescaling"},
         K.Rescaling(0.05, name="rescaling")),
        ({"class": "Dense", "units": 6, "activation": "selu", "name": "dense"},
         K.Dense(6, activation="selu", name="dense")),
        ({"class": "ELU", "alpha": 0.7, "name": "elu"}, K.ELU(alpha=0.7, name="elu")),
        ({"class": "Dense", "units": 4, "name": "dense_1"}, K.Dense(4, name="dense_1")),
        ({"class": "Softmax", "name": "softmax"}, K.Softmax(name="softmax")),
    ]
    for from_logits in [True, False]:
        cases.append(model_case(
            f"rescaling_selu_elu_softmax_layer_logits{int(from_logits)}",
            [c for c, _ in model], [l for _, l in model], (5,),
            "SparseCategoricalCrossentropy", from_logits, 4, input_scale=20.0))
    return cases


# Keras' optimizers, three steps on two variables: the config in distrain's
# terms (spec.training.optimizer), the variables before, each step's gradients
# and the variables after the last step.
OPTIMIZERS = [
    ("rmsprop", {"type": "rmsprop", "learningRate": 0.01},
     lambda: keras.optimizers.RMSprop(learning_rate=0.01)),
    ("rmsprop_centered", {"type": "rmsprop", "learningRate": 0.01, "rho": 0.8, "epsilon": 1e-3,
                          "centered": True},
     lambda: keras.optimizers.RMSprop(learning_rate=0.01, rho=0.8, epsilon=1e-3, centered=True)),
    ("adamw", {"type": "adamw", "learningRate": 0.01},
     lambda: keras.optimizers.AdamW(learning_rate=0.01)),
    ("adamw_decay", {"type": "adamw", "learningRate": 0.01, "weightDecay": 0.1, "beta1": 0.8},
     lambda: keras.optimizers.AdamW(learning_rate=0.01, weight_decay=0.1, beta_1=0.8)),
    ("adam_weight_decay", {"type": "adam", "learningRate": 0.01, "weightDecay": 0.05},
     lambda: keras.optimizers.Adam(learning_rate=0.01, weight_decay=0.05)),
    ("sgd_weight_decay", {"type": "sgd", "learningRate": 0.1, "weightDecay": 0.05},
     lambda: keras.optimizers.SGD(learning_rate=0.1, weight_decay=0.05)),
    ("nesterov_weight_decay", {"type": "momentum", "learningRate": 0.1, "momentum": 0.9,
                               "nesterov": True, "weightDecay": 0.01},
     lambda: keras.optimizers.SGD(learning_rate=0.1, momentum=0.9, nesterov=True,
                                  weight_decay=0.01)),
    # A schedule moves the rate between the three steps (and the decay uses it).
    ("adamw_cosine_warmup", {"type": "adamw", "learningRate": 0.001, "weightDecay": 0.1,
                             "schedule": {"type": "CosineDecay", "decaySteps": 2,
                                          "warmupSteps": 1, "warmupTarget": 0.05}},
     lambda: keras.optimizers.AdamW(
         learning_rate=keras.optimizers.schedules.CosineDecay(
             0.001, decay_steps=2, warmup_target=0.05, warmup_steps=1),
         weight_decay=0.1)),
    ("sgd_piecewise", {"type": "sgd", "learningRate": 0.1,
                       "schedule": {"type": "PiecewiseConstantDecay", "boundaries": [1],
                                    "values": [0.1, 0.02]}},
     lambda: keras.optimizers.SGD(
         learning_rate=keras.optimizers.schedules.PiecewiseConstantDecay([1], [0.1, 0.02]))),
]

# Keras' schedules evaluated at steps around their corners.
SCHEDULE_STEPS = [0, 1, 2, 5, 9, 10, 11, 50, 99, 100, 101, 150, 1000, 100000]
SCHEDULES = [
    ({"type": "ExponentialDecay", "decaySteps": 10, "decayRate": 0.9},
     lambda: keras.optimizers.schedules.ExponentialDecay(0.1, 10, 0.9)),
    ({"type": "ExponentialDecay", "decaySteps": 10, "decayRate": 0.5, "staircase": True},
     lambda: keras.optimizers.schedules.ExponentialDecay(0.1, 10, 0.5, staircase=True)),
    ({"type": "InverseTimeDecay", "decaySteps": 10, "decayRate": 0.5},
     lambda: keras.optimizers.schedules.InverseTimeDecay(0.1, 10, 0.5)),
    ({"type": "InverseTimeDecay", "decaySteps": 10, "decayRate": 0.5, "staircase": True},
     lambda: keras.optimizers.schedules.InverseTimeDecay(0.1, 10, 0.5, staircase=True)),
    ({"type": "PolynomialDecay", "decaySteps": 100},
     lambda: keras.optimizers.schedules.PolynomialDecay(0.1, 100)),
    ({"type": "PolynomialDecay", "decaySteps": 100, "endLearningRate": 0.01, "power": 2.0,
      "cycle": True},
     lambda: keras.optimizers.schedules.PolynomialDecay(0.1, 100, 0.01, power=2.0, cycle=True)),
    ({"type": "PiecewiseConstantDecay", "boundaries": [10, 100], "values": [0.1, 0.05, 0.01]},
     lambda: keras.optimizers.schedules.PiecewiseConstantDecay([10, 100], [0.1, 0.05, 0.01])),
    ({"type": "CosineDecay", "decaySteps": 100, "alpha": 0.1},
     lambda: keras.optimizers.schedules.CosineDecay(0.1, 100, alpha=0.1)),
    ({"type": "CosineDecay", "decaySteps": 100, "warmupSteps": 10, "warmupTarget": 0.5},
     lambda: keras.optimizers.schedules.CosineDecay(0.1, 100, warmup_target=0.5,
                                                      warmup_steps=10)),
]


def schedule_cases():
    cases = []
    for config, make in SCHEDULES:
        schedule = make()
        cases.append({
            "name": "schedule_" + "_".join(str(v) for v in config.values()),
            "kind": "schedule",
            "optimizer": {"type": "sgd", "learningRate": 0.1, "schedule": config},
            "steps": SCHEDULE_STEPS,
            "rates": [float("%.9g" % float(schedule(s))) for s in SCHEDULE_STEPS],
        })
    return cases


def optimizer_cases():
    cases = []
    for name, config, make in OPTIMIZERS:
        shapes = {"kernel": (3, 4), "bias": (4,)}
        before = {k: small(shape) for k, shape in shapes.items()}
        variables = {k: keras.Variable(v, name=k) for k, v in before.items()}
        optimizer = make()
        steps = []
        for _ in range(3):
            grads = {k: small(shape, 2.0) for k, shape in shapes.items()}
            optimizer.apply([tf.constant(grads[k]) for k in shapes],
                            [variables[k] for k in shapes])
            steps.append({k: arr(g) for k, g in grads.items()})
        cases.append({
            "name": f"optimizer_{name}",
            "kind": "optimizer",
            "optimizer": config,
            "variables": {k: {"shape": list(shapes[k]), "value": arr(v)}
                          for k, v in before.items()},
            "steps": steps,
            "after": {k: arr(variables[k].numpy()) for k in shapes},
        })
    return cases


def one_d_cases():
    """Keras' 1-D layers on [steps, channels] sequences."""
    cases = []
    K = keras.layers
    for padding in ["valid", "same"]:
        for stride in [1, 2]:
            for steps, k in [(9, 3), (8, 4)]:
                cases.append(layer_case(
                    f"conv1d_{padding}_s{stride}_{steps}_k{k}",
                    {"class": "Conv1D", "filters": 3, "kernelSize": k, "strides": stride,
                     "padding": padding},
                    K.Conv1D(3, k, strides=stride, padding=padding, name="conv1d"),
                    (steps, 2)))
    cases.append(layer_case(
        "conv1d_same_gelu_no_bias",
        {"class": "Conv1D", "filters": 4, "kernelSize": 5, "padding": "same",
         "activation": "gelu", "useBias": False},
        K.Conv1D(4, 5, padding="same", activation="gelu", use_bias=False, name="conv1d"),
        (7, 3)))
    for cls, kname in [(K.MaxPooling1D, "MaxPooling1D"), (K.AveragePooling1D, "AveragePooling1D")]:
        for padding in ["valid", "same"]:
            for pool, stride in [(2, None), (3, 2), (3, 1)]:
                cfg = {"class": kname, "poolSize": pool, "padding": padding}
                if stride is not None:
                    cfg["strides"] = stride
                cases.append(layer_case(
                    f"{kname.lower()}_{padding}_p{pool}_s{stride or pool}", cfg,
                    cls(pool, strides=stride, padding=padding, name="pool"), (9, 3),
                    distinct_input=True))
    cases.append(layer_case(
        "global_average_pooling1d", {"class": "GlobalAveragePooling1D"},
        K.GlobalAveragePooling1D(name="gap"), (7, 4)))
    # A sequence model: rows reshaped to [steps, 1], Conv1D relu into max
    # pooling (the fused ReLU gradient), another Conv1D, global pooling, Dense.
    seq = [
        ({"class": "Reshape", "targetShape": [12, 1], "name": "reshape"},
         K.Reshape((12, 1), name="reshape")),
        ({"class": "Conv1D", "filters": 4, "kernelSize": 3, "activation": "relu",
          "name": "conv1d"}, K.Conv1D(4, 3, activation="relu", name="conv1d")),
        ({"class": "MaxPooling1D", "poolSize": 2, "name": "max_pooling1d"},
         K.MaxPooling1D(2, name="max_pooling1d")),
        ({"class": "Conv1D", "filters": 6, "kernelSize": 2, "padding": "same",
          "activation": "tanh", "name": "conv1d_1"},
         K.Conv1D(6, 2, padding="same", activation="tanh", name="conv1d_1")),
        ({"class": "GlobalAveragePooling1D", "name": "global_average_pooling1d"},
         K.GlobalAveragePooling1D(name="global_average_pooling1d")),
        ({"class": "Dense", "units": 3, "name": "dense"}, K.Dense(3, name="dense")),
    ]
    cases.append(model_case(
        "conv1d_sequence_model", [c for c, _ in seq], [l for _, l in seq], (12,),
        "SparseCategoricalCrossentropy", True, 3, batch=5))
    return cases


def global_max_cases():
    """GlobalMaxPooling2D and 1D; a ReLU before one, whose zeros tie."""
    cases = []
    K = keras.layers
    cases.append(layer_case(
        "global_max_pooling2d", {"class": "GlobalMaxPooling2D"},
        K.GlobalMaxPooling2D(name="gmp"), (5, 4, 3), distinct_input=True))
    cases.append(layer_case(
        "global_max_pooling1d", {"class": "GlobalMaxPooling1D"},
        K.GlobalMaxPooling1D(name="gmp"), (7, 4), distinct_input=True))
    model = [
        ({"class": "Conv2D", "filters": 6, "kernelSize": [3, 3], "activation": "relu",
          "name": "conv2d"}, K.Conv2D(6, 3, activation="relu", name="conv2d")),
        ({"class": "GlobalMaxPooling2D", "name": "global_max_pooling2d"},
         K.GlobalMaxPooling2D(name="global_max_pooling2d")),
        ({"class": "Dense", "units": 3, "name": "dense"}, K.Dense(3, name="dense")),
    ]
    cases.append(model_case(
        "relu_global_max_pooling2d_model", [c for c, _ in model], [l for _, l in model],
        (6, 5, 2), "SparseCategoricalCrossentropy", True, 3, batch=4))
    return cases


def layer_and_rms_normalization_cases():
    """LayerNormalization for each center/scale choice, on rows, images and
    sequences, and RMSNormalization; inputs off-centre (an offset and a
    spread per example), so the row statistics matter. Keras computes both
    the same in training and evaluation."""
    cases = []
    K = keras.layers

    def shifted(vs):
        for k, v in vs.items():
            v.assign((1.0 if k in ("gamma", "scale") else 0.0) + small(v.shape, 0.5))

    for center, scale in [(True, True), (False, True), (True, False), (False, False)]:
        cases.append(layer_case(
            f"layer_normalization_rows_center{int(center)}_scale{int(scale)}",
            {"class": "LayerNormalization", "center": center, "scale": scale},
            K.LayerNormalization(center=center, scale=scale, name="ln"), (7,), training=True,
            input_scale=3.0, set_weights=shifted))
    cases.append(layer_case(
        "layer_normalization_images_eps1e-5",
        {"class": "LayerNormalization", "epsilon": 1e-5},
        K.LayerNormalization(epsilon=1e-5, name="ln"), (3, 2, 5), training=True,
        input_scale=2.0, set_weights=shifted))
    cases.append(layer_case(
        "layer_normalization_sequence_axis2", {"class": "LayerNormalization", "axis": 2},
        K.LayerNormalization(axis=2, name="ln"), (4, 6), training=True, set_weights=shifted))
    # Nearly constant rows: the variance is tiny next to epsilon.
    cases.append(layer_case(
        "layer_normalization_nearly_constant_rows", {"class": "LayerNormalization"},
        K.LayerNormalization(name="ln"), (9,), training=True, input_scale=0.01,
        set_weights=shifted))
    cases.append(layer_case(
        "rms_normalization_rows", {"class": "RMSNormalization"},
        K.RMSNormalization(name="rms"), (8,), training=True, input_scale=2.0,
        set_weights=shifted))
    cases.append(layer_case(
        "rms_normalization_sequence_eps1e-3", {"class": "RMSNormalization", "epsilon": 1e-3},
        K.RMSNormalization(epsilon=1e-3, name="rms"), (3, 5), training=True,
        set_weights=shifted))
    model = [
        ({"class": "Dense", "units": 12, "name": "dense"}, K.Dense(12, name="dense")),
        ({"class": "LayerNormalization", "name": "layer_normalization"},
         K.LayerNormalization(name="layer_normalization")),
        ({"class": "Activation", "activation": "gelu", "name": "activation"},
         K.Activation("gelu", name="activation")),
        ({"class": "Dense", "units": 8, "name": "dense_1"}, K.Dense(8, name="dense_1")),
        ({"class": "RMSNormalization", "name": "rms_normalization"},
         K.RMSNormalization(name="rms_normalization")),
        ({"class": "Dense", "units": 4, "name": "dense_2"}, K.Dense(4, name="dense_2")),
    ]
    cases.append(model_case(
        "layer_and_rms_normalization_model", [c for c, _ in model], [l for _, l in model],
        (10,), "SparseCategoricalCrossentropy", True, 4, batch=5, input_scale=2.0))
    return cases


def embedding_cases():
    """Embedding on whole-number ids held as floats (as distrain's features
    are): a sequence, a grid, repeated ids (their gradients add), and models
    that pool, flatten or convolve the vectors."""
    cases = []
    K = keras.layers
    for name, shape, vocab, dim in [("embedding_sequence", (6,), 9, 4),
                                    ("embedding_grid", (3, 4), 5, 3),
                                    ("embedding_one_id_column", (1,), 4, 7)]:
        cases.append(layer_case(
            name, {"class": "Embedding", "inputDim": vocab, "outputDim": dim},
            K.Embedding(vocab, dim, name="embedding"), shape, training=True, ids_below=vocab))
    for name, vocab, body in [
        ("embedding_average_pooling_model", 12, [
            ({"class": "Embedding", "inputDim": 12, "outputDim": 8, "name": "embedding"},
             K.Embedding(12, 8, name="embedding")),
            ({"class": "GlobalAveragePooling1D", "name": "global_average_pooling1d"},
             K.GlobalAveragePooling1D(name="global_average_pooling1d")),
            ({"class": "Dense", "units": 3, "name": "dense"}, K.Dense(3, name="dense"))]),
        ("embedding_conv1d_model", 7, [
            ({"class": "Embedding", "inputDim": 7, "outputDim": 5, "name": "embedding"},
             K.Embedding(7, 5, name="embedding")),
            ({"class": "Conv1D", "filters": 4, "kernelSize": 3, "activation": "relu",
              "name": "conv1d"}, K.Conv1D(4, 3, activation="relu", name="conv1d")),
            ({"class": "Flatten", "name": "flatten"}, K.Flatten(name="flatten")),
            ({"class": "Dense", "units": 3, "name": "dense"}, K.Dense(3, name="dense"))]),
    ]:
        cases.append(model_case(name, [c for c, _ in body], [l for _, l in body], (10,),
                                "SparseCategoricalCrossentropy", True, 3, batch=4,
                                ids_below=vocab))
    return cases


def dense_on_more_axes_cases():
    """Keras' Dense on a sequence or an image: the last axis, each position
    on its own (softmax too), and models that use it per token."""
    cases = []
    K = keras.layers
    cases.append(layer_case(
        "dense_sequence_relu", {"class": "Dense", "units": 5, "activation": "relu"},
        K.Dense(5, activation="relu", name="dense"), (4, 6)))
    cases.append(layer_case(
        "dense_sequence_softmax_no_bias",
        {"class": "Dense", "units": 3, "activation": "softmax", "useBias": False},
        K.Dense(3, activation="softmax", use_bias=False, name="dense"), (5, 4)))
    cases.append(layer_case(
        "dense_image", {"class": "Dense", "units": 4, "activation": "tanh"},
        K.Dense(4, activation="tanh", name="dense"), (3, 3, 2)))
    body = [
        ({"class": "Embedding", "inputDim": 9, "outputDim": 6, "name": "embedding"},
         K.Embedding(9, 6, name="embedding")),
        ({"class": "Dense", "units": 8, "activation": "gelu", "name": "dense"},
         K.Dense(8, activation="gelu", name="dense")),
        ({"class": "LayerNormalization", "name": "layer_normalization"},
         K.LayerNormalization(name="layer_normalization")),
        ({"class": "GlobalAveragePooling1D", "name": "global_average_pooling1d"},
         K.GlobalAveragePooling1D(name="global_average_pooling1d")),
        ({"class": "Dense", "units": 3, "name": "dense_1"}, K.Dense(3, name="dense_1")),
    ]
    cases.append(model_case(
        "embedding_dense_per_token_model", [c for c, _ in body], [l for _, l in body], (7,),
        "SparseCategoricalCrossentropy", True, 3, batch=4, ids_below=9))
    body = [
        ({"class": "Conv1D", "filters": 4, "kernelSize": 3, "name": "conv1d"},
         K.Conv1D(4, 3, name="conv1d")),
        ({"class": "Dense", "units": 5, "activation": "relu", "name": "dense"},
         K.Dense(5, activation="relu", name="dense")),
        ({"class": "Flatten", "name": "flatten"}, K.Flatten(name="flatten")),
        ({"class": "Dense", "units": 3, "name": "dense_1"}, K.Dense(3, name="dense_1")),
    ]
    cases.append(model_case(
        "conv1d_dense_per_step_model", [c for c, _ in body], [l for _, l in body], (8, 2),
        "SparseCategoricalCrossentropy", True, 3, batch=4))
    return cases


def causal_conv1d_cases():
    """Conv1D with Keras' causal padding (k - 1 zeros before the sequence):
    several kernel sizes and strides, and a stacked causal model."""
    cases = []
    K = keras.layers
    for k, stride in [(1, 1), (2, 1), (3, 1), (3, 2), (4, 3), (5, 1)]:
        cases.append(layer_case(
            f"conv1d_causal_k{k}_s{stride}",
            {"class": "Conv1D", "filters": 3, "kernelSize": k, "strides": stride,
             "padding": "causal"},
            K.Conv1D(3, k, strides=stride, padding="causal", name="conv"), (7, 2)))
    body = [
        ({"class": "Conv1D", "filters": 4, "kernelSize": 3, "padding": "causal",
          "activation": "relu", "name": "conv1d"},
         K.Conv1D(4, 3, padding="causal", activation="relu", name="conv1d")),
        ({"class": "Conv1D", "filters": 4, "kernelSize": 2, "padding": "causal",
          "name": "conv1d_1"}, K.Conv1D(4, 2, padding="causal", name="conv1d_1")),
        ({"class": "GlobalMaxPooling1D", "name": "global_max_pooling1d"},
         K.GlobalMaxPooling1D(name="global_max_pooling1d")),
        ({"class": "Dense", "units": 3, "name": "dense"}, K.Dense(3, name="dense")),
    ]
    cases.append(model_case(
        "causal_conv1d_model", [c for c, _ in body], [l for _, l in body], (9, 2),
        "SparseCategoricalCrossentropy", True, 3, batch=4))
    return cases


def main():
    keras.utils.set_random_seed(7)
    cases = (layer_cases() + model_cases() + more_activation_cases() + optimizer_cases() +
             schedule_cases() + one_d_cases() + global_max_cases() +
             layer_and_rms_normalization_cases() + embedding_cases() +
             dense_on_more_axes_cases() + causal_conv1d_cases())
    with open(OUT, "w") as f:
        json.dump({"generator": "tests/golden/make_layer_goldens.py",
                   "tensorflow": tf.__version__, "keras": keras.__version__,
                   "cases": cases}, f, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {len(cases)} cases to {OUT} ({os.path.getsize(OUT)} bytes)")


if __name__ == "__main__":
    sys.exit(main())
