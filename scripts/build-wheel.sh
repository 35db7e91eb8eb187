#!/usr/bin/env bash
# Builds the pip wheel from the CMake build, offline, with Debian's packaging tools
# (python3-build, python3-setuptools, python3-wheel; PYTHON picks the python3, else the
# first python3 that has them: on PATH, then /usr/bin/python3):
#   scripts/build-wheel.sh OUTDIR [BUILD_DIR]     (BUILD_DIR: build/, configured if needed)
#   scripts/build-wheel.sh --which-python         (only prints which Python would build it)
# gives OUTDIR/ncclwatch-<version>-py3-none-manylinux_<glibc>_x86_64.whl: the stripped command and
# libncclwatch.so, the Python package `ncclwatch`, the README as its description; and beside it
# OUTDIR/ncclwatch-<version>-debug.tar.gz, their debug info kept out of the wheel
# (usr/lib/debug/.build-id/..., found by build id: `tar -C / -xzf` as root).
set -euo pipefail

# The Python that builds the wheel: PYTHON if set, else the first of python3 on PATH and the
# system's /usr/bin/python3 that has the build, setuptools and wheel modules (python3 on PATH
# is often pyenv's or conda's, without the Debian packages scripts/install-deps.sh installed).
# Says which in one line, on stderr (stdout is the wheel's path).
find_python() {
  local candidates=("${PYTHON:-}") py tried=()
  [ -n "${PYTHON:-}" ] || candidates=("$(command -v python3 || true)" /usr/bin/python3)
  for py in "${candidates[@]}"; do
    [ -n "$py" ] && [ -x "$(command -v "$py" || true)" ] || continue
    if "$py" -c 'import build, setuptools, wheel' 2>/dev/null; then
      local why=""
      [ ${#tried[@]} -eq 0 ] || why=" (${tried[*]}: no build, setuptools or wheel module)"
      echo "build-wheel: building with $py$why" >&2
      python=$py
      return 0
    fi
    tried+=("$py")
  done
  echo "build-wheel: no Python with the build, setuptools and wheel modules (tried ${tried[*]:-none}): install" \
       "python3-build python3-setuptools python3-wheel (scripts/install-deps.sh) or set PYTHON" >&2
  return 1
}
find_python || exit 1
if [ "${1:-}" = --which-python ]; then
  echo "$python"
  exit 0
fi

out=${1:?usage: scripts/build-wheel.sh OUTDIR [BUILD_DIR]}
build=${2:-build}
src=$(cd "$(dirname "$0")/.." && pwd)
cd "$src"
[ -f "$build/CMakeCache.txt" ] || cmake -S . -B "$build" >/dev/null
cmake --build "$build" -j "$(nproc)" --target ncclwatch_stripped
stripped=$build/stripped
bin=$stripped/ncclwatch
lib=$stripped/libncclwatch.so
version=$("$build/bin/ncclwatch" --version | awk '{print $2}')
machine=$(uname -m)

# The platform tag is what the binaries need: glibc's own libraries and nothing else, and the
# highest glibc symbol version they use (manylinux_2_34 for a Debian 12 build).
glibc_libs='^(libc\.so\.6|libm\.so\.6|libpthread\.so\.0|libdl\.so\.2|librt\.so\.1|ld-linux[-a-z0-9_]*\.so\.[0-9])$'
for f in "$bin" "$lib"; do
  other=$(LC_ALL=C readelf -d "$f" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | grep -Ev "$glibc_libs" || true)
  if [ -n "$other" ]; then
    echo "build-wheel: $f needs more than glibc ($other): no manylinux tag fits" >&2
    exit 1
  fi
done
glibc=$(LC_ALL=C objdump -T "$bin" "$lib" | grep -o 'GLIBC_[0-9.]*' | sed 's/GLIBC_//' | sort -uV | tail -1)
[[ $glibc =~ ^2\.([0-9]+) ]] || { echo "build-wheel: no glibc version found in $bin, $lib" >&2; exit 1; }
platform=manylinux_2_${BASH_REMATCH[1]}_$machine

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
cp -r python/. "$stage/"
rm -rf "$stage/build" "$stage"/*.egg-info "$stage"/ncclwatch/__pycache__
echo "__version__ = \"$version\"" >"$stage/ncclwatch/_version.py"
cp README.md "$stage/"
mkdir -p "$stage/ncclwatch/bin" "$stage/ncclwatch/lib"
cp "$bin" "$stage/ncclwatch/bin/ncclwatch"
cp "$lib" "$stage/ncclwatch/lib/libncclwatch.so"

mkdir -p "$out"
NCCLWATCH_WHEEL_PLATFORM=$platform "$python" -m build --wheel --no-isolation --outdir "$out" "$stage" \
  >"$stage/build-wheel.log" 2>&1 || { cat "$stage/build-wheel.log" >&2; exit 1; }
wheel=$out/ncclwatch-$version-py3-none-$platform.whl
[ -f "$wheel" ] || { echo "build-wheel: $wheel was not made" >&2; exit 1; }
tar -C "$stripped" --transform 's,^debug,usr/lib/debug,' -czf "$out/ncclwatch-$version-debug.tar.gz" debug
echo "$wheel"
