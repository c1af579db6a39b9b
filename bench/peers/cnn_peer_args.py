"""What bench/cnn_training.py's CNN peers (tf_keras_cnn.py, torch_cnn.py) share:
their command line and the IDX header. Plain Python, importable from either
peer's environment."""
import argparse
import struct


def parse_args(extra=()):
    """The flags cnn_training.py passes every peer; `extra`: (flag, kwargs) pairs."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--train-images", required=True)
    ap.add_argument("--train-labels", required=True)
    ap.add_argument("--test-images", required=True)
    ap.add_argument("--test-labels", required=True)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--steps", type=int, default=300, help="timed steps")
    ap.add_argument("--warmup", type=int, default=20, help="untimed steps before them")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--precision", default="float32",
                    choices=["float32", "mixed_bfloat16", "mixed_float16"],
                    help="Keras' dtype policy names; each peer maps them to its own mixed precision")
    for flag, kwargs in extra:
        ap.add_argument(flag, **kwargs)
    return ap.parse_args()


def read_idx(path, ndims):
    """(dims, payload bytes) of an IDX file of unsigned bytes with `ndims` dimensions."""
    with open(path, "rb") as f:
        data = f.read()
    magic = struct.unpack(">I", data[:4])[0]
    if magic != 0x800 | ndims:
        raise SystemExit(f"{path}: IDX magic {magic:#x}, expected {0x800 | ndims:#x}")
    dims = struct.unpack(f">{ndims}I", data[4:4 + 4 * ndims])
    return dims, data[4 + 4 * ndims:]
