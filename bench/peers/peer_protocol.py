"""What every all-reduce peer of bench/allreduce_busbw.py shares with the
distrain side (bench/allreduce_busbw.cc): its flags, the iteration count
rank 0 picks from the warm-up, and the RESULT line it prints. Stdlib only:
each peer runs under its own interpreter (TensorFlow's venv, torch's venv).

The protocol, per size:
  1. input value(i, r) = (7 i + 3 r) mod 11 on rank r; the first all-reduce
     is checked on every rank against the exact sum;
  2. `warmup` more calls; rank 0 picks the iteration count (>= target
     seconds, >= min_iters, <= max_iters) and shares it by an all-reduce in
     which only rank 0 contributes;
  3. each call timed on its own on rank 0; the median is reported.
"""
import argparse
import json
import statistics


def parse_args():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="4096,65536,1048576,16777216,67108864",
                    help="comma-separated byte counts (multiples of 4)")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--min-iters", type=int, default=5)
    ap.add_argument("--max-iters", type=int, default=20000)
    ap.add_argument("--target-seconds", type=float, default=0.5)
    ap.add_argument("--timeout-seconds", type=float, default=300)
    return ap.parse_args()


def iterations_wanted(per_op_seconds, args):
    """Step 2: rank 0's choice from the warm-up's seconds per call."""
    if per_op_seconds <= 0:
        return args.min_iters
    return max(args.min_iters, min(args.max_iters, int(args.target_seconds / per_op_seconds) + 1))


def print_result(side, ranks, size_bytes, times):
    print("RESULT " + json.dumps({"side": side, "ranks": ranks, "bytes": size_bytes,
                                  "iters": len(times), "median_s": statistics.median(times),
                                  "mean_s": statistics.fmean(times)}), flush=True)
