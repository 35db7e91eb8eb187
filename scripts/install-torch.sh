#!/usr/bin/env bash
# Installs PyTorch from PyPI into a virtual environment (default /opt/ncclwatch-torch), for the
# tests of the launcher's store (tests/store: a real torchrun and TCPStore; no GPU needed). PyPI's
# x86-64 wheel brings its CUDA libraries as dependencies (about 4 GB installed): the import needs
# them even where no GPU is. Measured on the project's machine: see docs/install.md.
#   scripts/install-torch.sh [PREFIX]      (NCCLWATCH_TORCH_VERSION: default 2.15.0)
set -euo pipefail
prefix=${1:-/opt/ncclwatch-torch}
version=${NCCLWATCH_TORCH_VERSION:-2.15.0}
if [ -x "$prefix/bin/python" ] && "$prefix/bin/python" -c "import torch.distributed" 2>/dev/null; then
  echo "install-torch: $("$prefix/bin/python" -c 'import torch; print(torch.__version__)') already in $prefix"
  exit 0
fi
start=$(date +%s)
python3 -m venv "$prefix"
for try in 1 2; do
  if "$prefix/bin/pip" install -q --disable-pip-version-check --no-cache-dir "torch==$version"; then break; fi
  [ "$try" = 2 ] && { echo "install-torch: pip install torch==$version failed" >&2; exit 1; }
  echo "install-torch: retrying once"
done
"$prefix/bin/python" -c "import torch.distributed"
echo "install-torch: torch $version in $prefix in $(( $(date +%s) - start )) s ($(du -sh "$prefix" | cut -f1))"
