#!/usr/bin/env bash
# Simulator scale check (not a ctest): RANKS ranks x ITERS small all-reduces, each followed
# by a stream synchronize, through simlaunch. Prints the wall time. Target: under a minute
# for 64 x 1000 on 2 cores.
#   bench/bench_sim.sh [BUILD_DIR] [RANKS] [ITERS] [COUNT]
set -eu
build=${1:-build}
ranks=${2:-64}
iters=${3:-1000}
count=${4:-8}
bin=$build/bin
for f in "$bin/simlaunch" "$bin/sim_workload"; do
  [ -x "$f" ] || { echo "bench_sim.sh: $f not built (cmake --build $build --target simlaunch sim_workload)" >&2; exit 2; }
done
out=$(mktemp)
trap 'rm -f "$out"' EXIT
start=$(date +%s.%N)
if ! "$bin/simlaunch" -n "$ranks" --timeout 600 -- "$bin/sim_workload" --iters "$iters" --count "$count" >"$out" 2>&1; then
  cat "$out"
  echo "bench_sim.sh: the run failed" >&2
  exit 1
fi
elapsed=$(echo "$(date +%s.%N) - $start" | bc)
oks=$(grep -cx ok "$out" || true)
[ "$oks" = "$ranks" ] || { cat "$out"; echo "bench_sim.sh: $oks of $ranks ranks printed ok" >&2; exit 1; }
printf 'simulator: %d ranks x %d all-reduces (%d floats, sync after each): %.2f s wall, %.0f us per all-reduce\n' \
  "$ranks" "$iters" "$count" "$elapsed" "$(echo "$elapsed * 1000000 / $iters" | bc -l)"
