#!/usr/bin/env bash
# Installs what ncclwatch needs to build and test, from Debian/Ubuntu packages only.
set -euo pipefail
# python3-build, -setuptools, -wheel, -venv: the wheel (scripts/build-wheel.sh) and its test;
# python3-dev: the headers the stacks_python_layout test regenerates python3's frame layout from.
# ninja-build: the build tool the scripts use when present (scripts/cmake-env.sh).
# zlib1g: libz.so.1, opened at run time to compress the dumps published in the launcher's store.
pkgs=(build-essential cmake ninja-build pkg-config nlohmann-json3-dev catch2 libunwind-dev libbenchmark-dev libdw-dev python3
      python3-dev python3-build python3-setuptools python3-wheel python3-venv zlib1g)
missing=()
for p in "${pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
[ ${#missing[@]} -eq 0 ] && { echo "install-deps: all packages present"; exit 0; }
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
echo "install-deps: installing ${missing[*]}"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
