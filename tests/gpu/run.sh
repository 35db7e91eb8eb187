#!/usr/bin/env bash
# GPU checks of ncclwatch with PyTorch. Skips (exit 0) with a clear message where there is no
# CUDA GPU or no PyTorch. Results: printed, and written to $OUT/gpu-results.json if OUT is set.
#   tests/gpu/run.sh [BUILD_DIR]
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=$(cd "${1:-$here/../../build}" && pwd)
py=${PYTHON:-python3}
if ! "$py" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  echo "SKIP tests/gpu: no CUDA GPU visible to PyTorch (or no PyTorch) on this machine"
  exit 0
fi
exec "$py" "$here/gpu_checks.py" --lib "$build/lib/libncclwatch.so" --ncclwatch "$build/bin/ncclwatch" \
  ${OUT:+--json "$OUT/gpu-results.json"}
