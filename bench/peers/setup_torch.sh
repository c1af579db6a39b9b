#!/usr/bin/env bash
# PyTorch for the benchmarks' Gloo peer (bench/allreduce_busbw.py --sides gloo)
# and, later, the GPU benchmarks' PyTorch eager peer: its own venv under the
# project cache, keyed by version. Only the benchmarks need it, so
# scripts/setup.sh does not install it (about 3 GB with the CUDA libraries the
# PyPI wheel depends on; the CPU-only wheel lives on download.pytorch.org,
# which this project cannot rely on reaching). Prints the venv's python.
set -euo pipefail
TORCH_VERSION="${DISTRAIN_TORCH_VERSION:-2.15.0}"
CACHE="${DISTRAIN_CACHE:-$HOME/.cache/distrain}"
VENV="$CACHE/torch-venv-$TORCH_VERSION"
if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c 'import torch.distributed' > /dev/null 2>&1; then
  echo "[bench] installing torch $TORCH_VERSION into $VENV (once)" >&2
  rm -rf "$VENV"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q --disable-pip-version-check "torch==$TORCH_VERSION" >&2
fi
echo "$VENV/bin/python"
