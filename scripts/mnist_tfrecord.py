#!/usr/bin/env python3
"""Writes MNIST IDX files as TFRecord shards of tf.train.Example, with TensorFlow.

The files look like a TensorFlow user's MNIST: every record is

    tf.train.Example(features=tf.train.Features(feature={
        "image": bytes_list [one value: the 28x28 uint8 pixels, row-major (ndarray.tobytes())],
        "label": int64_list [one value: the digit],
    }))

written with tf.io.TFRecordWriter (and tf.io.TFRecordOptions for compression),
so the bytes are TensorFlow's own. Examples keep the IDX order; shard i of k
holds the contiguous slice [i*n//k, (i+1)*n//k), so the shards read in sorted
order are the IDX files again (what makes a tfrecord run comparable to an idx
run example for example).

Input: <idx dir>/{train,t10k}-{images-idx3,labels-idx1}-ubyte (scripts/mnist.sh).
Output: <out dir>/train-0000i-of-0000k.tfrecord[.gz|.zz] and test-... likewise.
Run with the TensorFlow venv's python (~/.cache/distrain/peers-venv/bin/python).

Usage: mnist_tfrecord.py IDX_DIR OUT_DIR [--compression NONE|GZIP|ZLIB]
           [--train-shards K] [--test-shards K] [--train-limit N] [--test-limit N]
"""
import argparse
import os
import struct
import sys

SUFFIX = {"NONE": ".tfrecord", "GZIP": ".tfrecord.gz", "ZLIB": ".tfrecord.zz"}


def read_idx(path, magic, ndims):
    import numpy as np
    with open(path, "rb") as f:
        data = f.read()
    got, = struct.unpack(">I", data[:4])
    if got != magic:
        sys.exit(f"{path}: IDX magic {got:#x}, expected {magic:#x}")
    dims = struct.unpack(f">{ndims}I", data[4:4 + 4 * ndims])
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndims).reshape(dims)


def write_split(tf, images, labels, out_dir, name, shards, compression):
    n = len(labels)
    options = tf.io.TFRecordOptions(compression_type="" if compression == "NONE" else compression)
    paths = []
    for i in range(shards):
        path = os.path.join(out_dir, f"{name}-{i:05d}-of-{shards:05d}{SUFFIX[compression]}")
        with tf.io.TFRecordWriter(path, options) as writer:
            for j in range(i * n // shards, (i + 1) * n // shards):
                example = tf.train.Example(features=tf.train.Features(feature={
                    "image": tf.train.Feature(
                        bytes_list=tf.train.BytesList(value=[images[j].tobytes()])),
                    "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[int(labels[j])])),
                }))
                writer.write(example.SerializeToString())
        paths.append(path)
    return paths


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("idx_dir")
    parser.add_argument("out_dir")
    parser.add_argument("--compression", choices=sorted(SUFFIX), default="GZIP")
    parser.add_argument("--train-shards", type=int, default=4)
    parser.add_argument("--test-shards", type=int, default=1)
    parser.add_argument("--train-limit", type=int, default=0, help="first N examples (0: all)")
    parser.add_argument("--test-limit", type=int, default=0, help="first N examples (0: all)")
    args = parser.parse_args()

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    os.makedirs(args.out_dir, exist_ok=True)
    for name, idx_name, shards, limit in (("train", "train", args.train_shards, args.train_limit),
                                          ("test", "t10k", args.test_shards, args.test_limit)):
        images = read_idx(os.path.join(args.idx_dir, f"{idx_name}-images-idx3-ubyte"), 2051, 3)
        labels = read_idx(os.path.join(args.idx_dir, f"{idx_name}-labels-idx1-ubyte"), 2049, 1)
        if limit:
            images, labels = images[:limit], labels[:limit]
        paths = write_split(tf, images, labels, args.out_dir, name, shards, args.compression)
        print(f"{name}: {len(labels)} examples in {shards} {args.compression} shard(s) -> "
              f"{', '.join(paths)}", file=sys.stderr)


if __name__ == "__main__":
    main()
