#!/usr/bin/env bash
# Fresh Debian/Ubuntu machine to a verdict in one command: installs the packages, builds, and
# runs the demo (a simulated 8-rank job that hangs, analyzed by ncclwatch). No GPU needed.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh build
exec examples/demo/hang_demo.sh build
