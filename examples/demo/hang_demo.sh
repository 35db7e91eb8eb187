#!/usr/bin/env bash
# The ncclwatch demo, no GPU needed: a simulated 8-rank job where rank 3 is busy outside NCCL
# (as if saving a checkpoint) while the other seven wait in an all-gather. ncclwatch is
# preloaded into every rank, catches the stall in seconds, every rank dumps, and
# `ncclwatch analyze` names the culprit.
#   examples/demo/hang_demo.sh [BUILD_DIR]
set -uo pipefail
build=$(cd "${1:-build}" && pwd)
dir=$(mktemp -d "${TMPDIR:-/tmp}/ncclwatch-demo-XXXXXX")
echo "== an 8-rank job (GPU-free simulator): rank 3 stops calling NCCL at iteration 20"
echo "   dumps go to $dir; the stall deadline is 5 s here (NCCLWATCH_TIMEOUT) to keep it short"
NCCLWATCH_DIR="$dir" NCCLWATCH_TIMEOUT=5 NCCLWATCH_PEER_POLL_MS=200 \
  "$build/bin/ncclwatch" run --dir "$dir" --no-analyze -- \
  "$build/bin/simlaunch" -n 8 --timeout 9 --quiet -- \
  "$build/bin/sim_workload" --op allgather --iters 100 --busy-rank 3 --busy-at 20 --busy-ms -1
echo
echo "== ncclwatch analyze $dir"
"$build/bin/ncclwatch" analyze "$dir"
status=$?
[ $status -eq 1 ] && exit 0  # 1 = a hang was attributed: what the demo shows
exit $status
