#!/usr/bin/env bash
# The README's first command: installs what is missing, builds, and runs the
# default example job locally (OneDevice on a synthetic dataset).
#   scripts/quickstart.sh [job.yaml]
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --no-peers
scripts/build.sh
exec "${DISTRAIN_BUILD_DIR:-build}/cli/distrain" run "${1:-examples/onedevice.yaml}"
