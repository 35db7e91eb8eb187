#!/usr/bin/env bash
# Configures and builds ncclwatch into BUILD_DIR (default build/). Extra args go to cmake.
#   scripts/build.sh [BUILD_DIR] [-DCMAKE_OPTION=...]
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/cmake-env.sh
build=${1:-build}
shift || true
cmake -S . -B "$build" "$@" >/dev/null
# Two compiles more than cores: on a machine that other work loads, each compile gets a share of
# the cores as each of theirs does, so a build of N compiles gets more than one of N+2 (and a
# compile waiting on the disk leaves its core to another). Peak memory: about 0.7 GB a compile.
cmake --build "$build" -j "$(($(nproc) + 2))"
