"""Writes guide_cnn.json: the CNN of examples/cnn-mnist.yaml built in Keras and
saved with model.to_json(), the input of `distrain import-keras`.

    ~/.cache/distrain/peers-venv/bin/python examples/keras/guide_cnn.py
"""
import os

import keras

model = keras.Sequential([
    keras.Input(shape=(28, 28, 1)),
    keras.layers.Conv2D(32, 3, activation="relu"),
    keras.layers.MaxPooling2D(),
    keras.layers.Conv2D(64, 3, activation="relu"),
    keras.layers.Flatten(),
    keras.layers.Dense(64, activation="relu"),
    keras.layers.Dense(10, activation="softmax"),
])
path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "guide_cnn.json")
with open(path, "w") as f:
    f.write(model.to_json(indent=2))
print(f"wrote {path}: {model.count_params()} parameters")
