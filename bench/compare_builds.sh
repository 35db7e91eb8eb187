#!/usr/bin/env bash
# Compares ncclwatch's overhead per intercepted call between two builds (say, main and a
# change), alternating processes of one and the other so that both see the same machine load:
#   bench/compare_builds.sh BUILD_A BUILD_B [PAIRS] [FILTER]
# Each process runs bench_intercept's direct and wrapped calls (FILTER, default the issue regime,
# shallow) with 3 repetitions interleaved at random, and yields its own overhead (wrapped median
# minus direct median). Prints every process's overhead and the median per build
# (bench/overheads.py; the runs are made as run_bench.sh makes them: intercept_common.sh).
# Call-site stacks are on (the default configuration); set NCCLWATCH_CALLSITES=0 to compare with
# them off. PIN=CPU runs every process on that one CPU (taskset): all of the library's threads
# then take their time from the calling thread's wall time, and no cache line moves between
# cores, which makes the figures steadier (see docs/performance.md). A_ENV and B_ENV add
# variables to one side only, which compares two configurations of one build:
#   A_ENV=NCCLWATCH_CALLSITES=1 B_ENV=NCCLWATCH_CALLSITES=0 bench/compare_builds.sh build build
set -euo pipefail
here=$(dirname "$0")
. "$here/intercept_common.sh"
a=${1:?BUILD_A}
b=${2:?BUILD_B}
pairs=${3:-8}
filter=${4:-issue/.*/shallow}
intercept_bin "$a" >/dev/null && intercept_bin "$b" >/dev/null || exit 2
out=$(mktemp -d)
export NCCLWATCH_DIR=$(mktemp -d)
trap 'rm -rf "$out" "$NCCLWATCH_DIR"' EXIT

run() {  # a|b
  if [ "$1" = a ]; then run_intercept "$a" "$out/a.$p.json" "$filter" 3 "${PIN:-}" ${A_ENV:-}
  else run_intercept "$b" "$out/b.$p.json" "$filter" 3 "${PIN:-}" ${B_ENV:-}; fi
}
for p in $(seq "$pairs"); do
  # Alternate which build goes first, so neither always runs right after the other.
  if (( p % 2 )); then run a; run b; else run b; run a; fi
done
python3 "$here/overheads.py" "$out" "a=a $a ${A_ENV:-}" "b=b $b ${B_ENV:-}"
