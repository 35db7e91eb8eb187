#!/usr/bin/env bash
# Fresh Debian/Ubuntu machine to a verdict in one command: installs the packages, builds, and
# runs the demo (a simulated 8-rank job that hangs, analyzed by ncclwatch). No GPU needed.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
source scripts/cmake-env.sh
# Only what the demo runs (scripts/test.sh builds the rest).
cmake -S . -B build >/dev/null
cmake --build build -j "$(($(nproc) + 2))" --target ncclwatch ncclwatch_preload simlaunch sim_workload
exec examples/demo/hang_demo.sh build
