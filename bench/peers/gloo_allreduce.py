#!/usr/bin/env python3
"""Gloo peer for bench/allreduce_busbw.py: torch.distributed all-reduce, float32, SUM.

One process per rank on 127.0.0.1; the driver passes TF_CONFIG (the same one
every side gets) and this script takes rank = task index, world = number of
workers, and rendezvous at worker 0's port (torch's TCPStore). The backend is
gloo over TCP on the loopback interface (GLOO_SOCKET_IFNAME=lo): PyTorch's
CPU collective, the one DistributedDataParallel uses without GPUs. In place
on one buffer, call after call, as the distrain and MPI sides do.

Same protocol as the distrain side (peer_protocol.py).

Rank 0 prints one line per size:
  RESULT {"side": "gloo", "ranks": N, "bytes": B, "iters": K, "median_s": T, "mean_s": T}
Exit 1 (with a message) when a result is wrong.
"""
import datetime
import json
import os
import sys
import time

os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from peer_protocol import iterations_wanted, parse_args, print_result  # noqa: E402

args = parse_args()

tf_config = json.loads(os.environ["TF_CONFIG"])
rank = tf_config["task"]["index"]
workers = tf_config["cluster"]["worker"]
world = len(workers)
host, port = workers[0].rsplit(":", 1)
torch.set_num_threads(1)  # the reduction's own threads would not be what gloo's ring uses
dist.init_process_group("gloo", init_method=f"tcp://{host}:{port}", rank=rank, world_size=world,
                        timeout=datetime.timedelta(seconds=args.timeout_seconds))

for size_bytes in (int(s) for s in args.sizes.split(",")):
    count = size_bytes // 4
    idx = torch.arange(count, dtype=torch.int64)
    x = ((7 * idx + 3 * rank) % 11).to(torch.float32)

    # 1. Correctness.
    got = x.clone()
    dist.all_reduce(got, op=dist.ReduceOp.SUM)
    want = torch.zeros(count, dtype=torch.float32)
    for r in range(world):
        want += ((7 * idx + 3 * r) % 11).to(torch.float32)
    if not torch.equal(got, want):
        bad = torch.nonzero(got != want).flatten()
        sys.exit(f"gloo_allreduce: rank {rank}: {bad.numel()} of {count} elements wrong "
                 f"(first at {int(bad[0])}: {float(got[bad[0]])} != {float(want[bad[0]])})")
    del idx, want, got

    # 2. Warm-up; rank 0 picks the iteration count.
    work = x.clone()
    t0 = time.perf_counter()
    for _ in range(args.warmup):
        dist.all_reduce(work, op=dist.ReduceOp.SUM)
    iters = iterations_wanted((time.perf_counter() - t0) / max(args.warmup, 1), args)
    share = torch.tensor([float(iters) if rank == 0 else 0.0])
    dist.all_reduce(share, op=dist.ReduceOp.SUM)
    iters = int(share.item())

    # 3. Timed.
    times = []
    for _ in range(iters):
        a = time.perf_counter()
        dist.all_reduce(work, op=dist.ReduceOp.SUM)
        times.append(time.perf_counter() - a)
    if rank == 0:
        print_result("gloo", world, size_bytes, times)

dist.destroy_process_group()
