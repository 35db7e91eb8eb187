#!/usr/bin/env bash
# Installs PyTorch from PyPI into a virtual environment (default /opt/ncclwatch-torch), for the
# tests of the launcher's store (tests/store: a real torchrun and TCPStore; no GPU needed). PyPI's
# x86-64 wheel brings its CUDA libraries as dependencies (about 5 GB installed): the import needs
# them even where no GPU is. The venv's pip only installs uv (from PyPI), which installs torch:
# pip took 8 min 46 s on the project's loaded 2-core machine, uv 38 s (it unpacks in parallel
# and compiles no bytecode). Exit status 0 when torch.distributed imports.
#   scripts/install-torch.sh [PREFIX]      (NCCLWATCH_TORCH_VERSION: default 2.15.0)
set -euo pipefail
prefix=${1:-/opt/ncclwatch-torch}
version=${NCCLWATCH_TORCH_VERSION:-2.15.0}
if [ -x "$prefix/bin/python" ] && "$prefix/bin/python" -c "import torch.distributed" 2>/dev/null; then
  echo "install-torch: $("$prefix/bin/python" -c 'import torch; print(torch.__version__)' 2>/dev/null) already in $prefix"
  exit 0
fi
start=$(date +%s)
python3 -m venv "$prefix"
for try in 1 2; do
  if "$prefix/bin/pip" install -q --disable-pip-version-check --no-cache-dir uv &&
     VIRTUAL_ENV="$prefix" "$prefix/bin/uv" pip install -q --no-cache --python "$prefix/bin/python" "torch==$version"; then
    break
  fi
  [ "$try" = 2 ] && { echo "install-torch: installing torch==$version from PyPI failed" >&2; exit 1; }
  echo "install-torch: retrying once"
done
"$prefix/bin/python" -c "import torch.distributed" 2>/dev/null
echo "install-torch: torch $version in $prefix in $(( $(date +%s) - start )) s ($(du -sh "$prefix" | cut -f1))"
