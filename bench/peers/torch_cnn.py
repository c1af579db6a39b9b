#!/usr/bin/env python3
"""PyTorch eager peer for bench/cnn_training.py: the CNN of TensorFlow's
distributed-training guide, written in PyTorch the way its users write it (an
nn.Sequential, a plain training loop), trained on MNIST IDX files, on the CPU
or a CUDA GPU.

  Conv2d(1->32, 3x3) ReLU -> MaxPool2d(2) -> Conv2d(32->64, 3x3) ReLU ->
  Flatten -> Linear(->64) ReLU -> Linear(64->10) [-> Softmax]

The same function as the Keras and distrain sides: Keras' initialisers
(Glorot uniform kernels, zero biases), Adam with Keras' epsilon (1e-7), and
the loss the guide's from_logits=True on a softmax output amounts to: Keras
finds the softmax's input kept on its output and takes that as the logits
(with a warning), and distrain does the same, so the loss here is
cross-entropy of the last Linear's output; the softmax only predicts.
Pixels scaled by 1/255. Images stay on the
host like distrain's batches and are copied to the device each step (pinned,
asynchronous). The whole training split is reshuffled every epoch and
batches run across epoch boundaries. Times the steps after `warmup`: wall
time from the start of step `warmup` to the end of the last step (the device
synchronised at both ends). Then evaluates on the test files and prints:
  RESULT {"examples_per_second": ..., "timed_steps": ..., "seconds": ...,
          "test_accuracy": ..., "test_loss": ..., "mean_train_loss": ...,
          "torch": ..., "device": ...}
"""
import json
import time

import cnn_peer_args

import torch
import torch.nn.functional as F
from torch import nn


def read_idx(path, ndims):
    dims, payload = cnn_peer_args.read_idx(path, ndims)
    return torch.frombuffer(bytearray(payload), dtype=torch.uint8).reshape(dims)


args = cnn_peer_args.parse_args([("--device", {"default": "cpu", "help": "cpu or cuda"})])

torch.manual_seed(args.seed)
shuffle = torch.Generator().manual_seed(args.seed)
device = torch.device(args.device)
if device.type == "cuda":
    # FP32 as the other sides compute it: no TF32 in matmuls or convolutions.
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.benchmark = True
x_train = (read_idx(args.train_images, 3).float() / 255.0).unsqueeze(1)
y_train = read_idx(args.train_labels, 1).long()
x_test = (read_idx(args.test_images, 3).float() / 255.0).unsqueeze(1)
y_test = read_idx(args.test_labels, 1).long()

model = nn.Sequential(
    nn.Conv2d(1, 32, 3), nn.ReLU(), nn.MaxPool2d(2),
    nn.Conv2d(32, 64, 3), nn.ReLU(), nn.Flatten(),
    nn.Linear(64 * 11 * 11, 64), nn.ReLU(), nn.Linear(64, 10))  # logits; softmax in predictions
for m in model.modules():
    if isinstance(m, (nn.Conv2d, nn.Linear)):
        nn.init.xavier_uniform_(m.weight)
        nn.init.zeros_(m.bias)
model.to(device)
optimizer = torch.optim.Adam(model.parameters(), lr=args.lr, eps=1e-7)
# Mixed precision the way PyTorch users write it: autocast around the forward
# pass and the loss (float32 parameters, 16-bit products), and a GradScaler
# (dynamic loss scaling, 2^16 initial) for float16.
autocast_dtype = {"mixed_bfloat16": torch.bfloat16, "mixed_float16": torch.float16}.get(args.precision)
scaler = torch.amp.GradScaler(device.type, enabled=args.precision == "mixed_float16")


def forward_loss(x, y):
    if autocast_dtype is None:
        return F.cross_entropy(model(x), y)
    with torch.autocast(device.type, dtype=autocast_dtype):
        return F.cross_entropy(model(x), y)


def batches():
    n = len(y_train)
    order, pos = torch.randperm(n, generator=shuffle), 0
    while True:
        take, have = [], 0
        while have < args.batch:
            if pos == n:
                order, pos = torch.randperm(n, generator=shuffle), 0
            k = min(args.batch - have, n - pos)
            take.append(order[pos:pos + k])
            pos, have = pos + k, have + k
        idx = torch.cat(take)
        x, y = x_train[idx], y_train[idx]
        yield (x.pin_memory(), y.pin_memory()) if device.type == "cuda" else (x, y)


def sync():
    if device.type == "cuda":
        torch.cuda.synchronize(device)


total = args.warmup + args.steps
losses = []
model.train()
stream = batches()
start = None
for step in range(total):
    if step == args.warmup:
        sync()
        start = time.perf_counter()
    x, y = next(stream)
    x = x.to(device, non_blocking=True)
    y = y.to(device, non_blocking=True)
    optimizer.zero_grad(set_to_none=True)
    loss = forward_loss(x, y)
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    losses.append(loss.detach())
sync()
seconds = time.perf_counter() - start

model.eval()
with torch.no_grad():
    correct, loss_sum = 0, 0.0
    for i in range(0, len(y_test), 500):
        x, y = x_test[i:i + 500].to(device), y_test[i:i + 500].to(device)
        if autocast_dtype is None:
            out = model(x)
        else:
            with torch.autocast(device.type, dtype=autocast_dtype):
                out = model(x).float()
        loss_sum += F.cross_entropy(out, y, reduction="sum").item()
        correct += (out.argmax(1) == y).sum().item()
print("RESULT " + json.dumps({
    "examples_per_second": args.steps * args.batch / seconds,
    "timed_steps": args.steps, "seconds": seconds,
    "test_accuracy": correct / len(y_test), "test_loss": loss_sum / len(y_test),
    "mean_train_loss": float(torch.stack(losses).mean()),
    "torch": torch.__version__, "device": str(device),
    "threads": torch.get_num_threads(),
}), flush=True)
