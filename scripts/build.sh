#!/usr/bin/env bash
# Configures and builds ncclwatch into BUILD_DIR (default build/). Extra args go to cmake.
#   scripts/build.sh [BUILD_DIR] [-DCMAKE_OPTION=...]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
shift || true
cmake -S . -B "$build" "$@" >/dev/null
cmake --build "$build" -j "$(nproc)"
