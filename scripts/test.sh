#!/usr/bin/env bash
# The README's test command: installs what is missing, builds, runs every test
# tier that exists (unit, integration; kube and e2e join as they land).
# GPU tests skip cleanly on machines without a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
# The kube tier runs against a real kube-apiserver built from Go modules
# (cached under ~/.cache/distrain/kube-<version>; cold build ~10-20 min).
scripts/control-plane.sh build
# The e2e tier's real node (scripts/node.sh): CoreDNS from its pinned module and
# the node's sandbox image, cached by version (kubelet, kube-scheduler and
# kube-proxy come with the control plane's build above).
scripts/node.sh build
# Kueue for the e2e tier's Kueue test, built from its pinned module into the same
# cache (~/.cache/distrain/kueue-<version>).
scripts/kueue.sh build
# Prometheus for the e2e tier's dashboard test, built from its pinned module into
# the same cache (~/.cache/distrain/prometheus-<version>; Debian 12's package
# lacks kubernetes service discovery).
scripts/prometheus.sh build
# Real MNIST digits (cached) for the CNN integration tests, and the same split
# as TFRecord shards written by TensorFlow (the TFRecord and workflow tests).
scripts/mnist.sh > /dev/null
scripts/mnist_tfrecord.sh > /dev/null
[ "$(id -u)" != 0 ] || scripts/build-tf-image.sh > /dev/null  # e2e.tensorflow_image's TensorFlow image (cached by version)
BUILD_DIR="${DISTRAIN_BUILD_DIR:-build}"
cd "$BUILD_DIR"
# Integration tests start several processes each; run them one at a time on
# small machines so their timing assertions stay meaningful.
ctest --output-on-failure --timeout 300 -j "${DISTRAIN_TEST_JOBS:-2}" -LE serial
ctest --output-on-failure --timeout 900 -L serial
# Fuzz tier: every parser of outside input under libFuzzer with ASan + UBSan
# (a clang build in build-fuzz/, cached by ccache), each target 15 s over its
# corpus in tests/fuzz/corpus/; any crash fails the run.
cd - > /dev/null
DISTRAIN_FUZZ_SECONDS="${DISTRAIN_FUZZ_SECONDS:-15}" scripts/fuzz.sh
