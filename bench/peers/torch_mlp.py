#!/usr/bin/env python3
"""PyTorch eager peer for bench/single_process_throughput.py, on the CPU or a
CUDA GPU.

Same model as the other sides (MLP 784-1024-1024-10, ReLU, softmax
cross-entropy from logits), Keras' initialisers (Glorot uniform, zero
biases), Adam lr 1e-3 with Keras' epsilon, batch 256, float32, TF32 off.
Data: 20,000 in-memory synthetic examples shaped like the others (10 class
centres plus noise) in host memory, each batch copied to the device per step
(pinned, asynchronous) as distrain's are. Times `steps` steps after `warmup`
(device synchronised at both ends) and prints:
  RESULT {"examples_per_second": ..., "torch": ..., "device": ...}
"""
import argparse
import json
import time

import torch
import torch.nn.functional as F
from torch import nn

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=200)
ap.add_argument("--warmup", type=int, default=40)
ap.add_argument("--batch", type=int, default=256)
ap.add_argument("--device", default="cpu", help="cpu or cuda")
args = ap.parse_args()

device = torch.device(args.device)
if device.type == "cuda":
    torch.backends.cuda.matmul.allow_tf32 = False
gen = torch.Generator().manual_seed(42)
n = 20000
centres = torch.randn(10, 784, generator=gen)
labels = torch.randint(0, 10, (n,), generator=gen)
features = centres[labels] + torch.randn(n, 784, generator=gen)

model = nn.Sequential(nn.Linear(784, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(),
                      nn.Linear(1024, 10))
for m in model.modules():
    if isinstance(m, nn.Linear):
        nn.init.xavier_uniform_(m.weight)
        nn.init.zeros_(m.bias)
model.to(device)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, eps=1e-7)


def sync():
    if device.type == "cuda":
        torch.cuda.synchronize(device)


order = torch.randperm(n, generator=gen)
start = None
for step in range(args.warmup + args.steps):
    if step == args.warmup:
        sync()
        start = time.perf_counter()
    lo = (step * args.batch) % (n - args.batch)
    idx = order[lo:lo + args.batch]
    x, y = features[idx], labels[idx]
    if device.type == "cuda":
        x, y = x.pin_memory(), y.pin_memory()
    x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
    optimizer.zero_grad(set_to_none=True)
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
sync()
seconds = time.perf_counter() - start
print("RESULT " + json.dumps({"examples_per_second": args.steps * args.batch / seconds,
                              "torch": torch.__version__, "device": str(device),
                              "threads": torch.get_num_threads()}), flush=True)
