#!/usr/bin/env bash
# Times `ncclwatch analyze` on synthetic dump sets (full 4096-entry rings, realistic stacks) of
# 1,024, 4,096 and 16,384 ranks: wall time, bytes read and peak RSS. Not run by ctest.
#
# usage: bench/bench_scale.sh [CACHE_DIR] [RANKS...]
#   CACHE_DIR  where generated sets are kept between runs (default /tmp/ncclwatch-scale);
#              16,384 ranks take about 22 GB: delete the directory when done
#   RANKS      sizes to run (default: 1024 4096 16384)
# env: NCCLWATCH_BIN   directory holding ncclwatch and ncclwatch-gen (default build/bin)
#      SCENARIO        generator scenario (default rank_missing)
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
bin=${NCCLWATCH_BIN:-$here/../build/bin}
cache=${1:-/tmp/ncclwatch-scale}
shift || true
sizes=("$@")
[ ${#sizes[@]} -gt 0 ] || sizes=(1024 4096 16384)
scenario=${SCENARIO:-rank_missing}
[ -x /usr/bin/time ] || { echo "bench_scale.sh: needs /usr/bin/time (apt-get install time)" >&2; exit 2; }
for tool in ncclwatch ncclwatch-gen; do
  [ -x "$bin/$tool" ] || { echo "bench_scale.sh: $bin/$tool not built" >&2; exit 2; }
done

printf '%-7s %-6s %-10s %-14s %-14s %-12s %s\n' ranks cache wall_s summary_MB detail_MB peak_RSS_MB verdict
for n in "${sizes[@]}"; do
  dir=$cache/$n-$scenario
  if [ ! -f "$dir/.complete" ]; then
    rm -rf "$dir"
    mkdir -p "$dir"
    "$bin/ncclwatch-gen" --ranks "$n" --scenario "$scenario" --out "$dir" >&2
    touch "$dir/.complete"
  fi
  # A cold page cache when we may drop it (root); otherwise the numbers are warm-cache ones.
  state=warm
  if sync && echo 3 2>/dev/null >/proc/sys/vm/drop_caches; then state=cold; fi
  log=$(mktemp)
  set +e
  /usr/bin/time -v "$bin/ncclwatch" analyze "$dir" --json --verbose >"$log.json" 2>"$log"
  rc=$?
  set -e
  [ "$rc" -le 1 ] || { cat "$log" >&2; exit 1; }
  wall=$(sed -n 's/.*; \([0-9.]*\) s; peak RSS.*/\1/p' "$log")
  summary=$(sed -n 's/.*read \([0-9]*\) bytes of summaries.*/\1/p' "$log")
  detail=$(sed -n 's/.*summaries + \([0-9]*\) bytes of.*/\1/p' "$log")
  rss=$(sed -n 's/.*Maximum resident set size (kbytes): \([0-9]*\).*/\1/p' "$log")
  elapsed=$(sed -n 's/.*Elapsed (wall clock) time.*: \(.*\)/\1/p' "$log")
  verdict=$(grep -m1 '"cause"' "$log.json" | sed 's/.*: "\(.*\)".*/\1/')
  printf '%-7s %-6s %-10s %-14s %-14s %-12s %s (process wall %s)\n' "$n" "$state" "$wall" \
    "$(awk -v b="$summary" 'BEGIN{printf "%.1f", b/1e6}')" "$(awk -v b="$detail" 'BEGIN{printf "%.1f", b/1e6}')" \
    "$(awk -v k="$rss" 'BEGIN{printf "%.1f", k/1024}')" "$verdict" "$elapsed"
  rm -f "$log" "$log.json"
done
