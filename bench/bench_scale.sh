#!/usr/bin/env bash
# Times `ncclwatch analyze` (or another reading command) on synthetic dump sets of growing size,
# this build against a baseline build in the same run: runs alternate between the two builds,
# and the script prints each one's median wall time and peak RSS and their ratios. Not run by
# ctest.
#
# usage: bench/bench_scale.sh [CACHE_DIR] [RANKS...]
#   CACHE_DIR  where generated sets are kept between runs (default /tmp/ncclwatch-scale);
#              131,072 ranks with RING=256 take about 3.1 GB, 16,384 ranks with the default
#              ring about 2.8 GB: delete the directory when done
#   RANKS      sizes to run (default: 16384 65536 131072)
# env: NCCLWATCH_BIN  directory holding this build's ncclwatch and ncclwatch-gen (default build/bin)
#      BASELINE_BIN   directory holding the baseline's ncclwatch (a build of the previous
#                     commit, say); unset: this build alone
#      RUNS           timed runs per build and size (default 3); one untimed run first warms
#                     the page cache
#      RING           ring entries per dump (default: the generator's, 4096)
#      SCENARIO       generator scenario (default rank_missing); the culprit is rank 7 * N / 11
#      COMMAND        what to time (default "analyze --verbose"; "timeline -o /dev/null",
#                     "analyze --slow-ranks --verbose", ...), DIR is appended
#      COLD=1         drop the page cache before each run (needs root)
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
bin=${NCCLWATCH_BIN:-$here/../build/bin}
base=${BASELINE_BIN:-}
cache=${1:-/tmp/ncclwatch-scale}
shift || true
sizes=("$@")
[ ${#sizes[@]} -gt 0 ] || sizes=(16384 65536 131072)
runs=${RUNS:-3}
ring=${RING:-}
scenario=${SCENARIO:-rank_missing}
command=${COMMAND:-analyze --verbose}
[ -x /usr/bin/time ] || { echo "bench_scale.sh: needs /usr/bin/time (apt-get install time)" >&2; exit 2; }
for tool in "$bin/ncclwatch" "$bin/ncclwatch-gen" ${base:+"$base/ncclwatch"}; do
  [ -x "$tool" ] || { echo "bench_scale.sh: $tool not built" >&2; exit 2; }
done

# One run: "<wall s> <peak RSS MB> <CPU s, user + sys> <verdict>" on stdout; the command's stderr kept in $2.err.
run_once() {
  local exe=$1 dir=$2 log
  log=$(mktemp)
  if [ "${COLD:-0}" = 1 ]; then sync && echo 3 >/proc/sys/vm/drop_caches; fi
  set +e
  # shellcheck disable=SC2086  # COMMAND is words
  /usr/bin/time -f 'bench_scale %e %M %U %S' "$exe" $command "$dir" >"$log.out" 2>"$log"
  local rc=$?
  set -e
  [ "$rc" -le 1 ] || { cat "$log" >&2; rm -f "$log" "$log.out"; exit 1; }
  local verdict
  verdict=$(sed -n '0,/^1\. /s/^1\. *\([a-z_]*\) *\(rank[s]* [0-9]*\).*/\1 \2/p' "$log.out" | head -1)
  awk -v v="${verdict:-"-"}" '/^bench_scale / {printf "%s %.1f %.2f %s\n", $2, $3/1024, $4 + $5, v}' "$log"
  mv "$log" "$dir.err"
  rm -f "$log.out"
}

median() { sort -g | awk '{a[NR]=$1} END {if (NR%2) print a[(NR+1)/2]; else printf "%.2f\n", (a[NR/2]+a[NR/2+1])/2}'; }

echo "# $(date -u +%FT%TZ) $(uname -m), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg); runs=$runs ring=${ring:-default} command='$command'"
# CPU time (user + sys) tells the builds apart on a machine others load, where wall time cannot.
printf '%-7s %-10s %-10s %-10s %-10s %-10s %-10s %-11s %-11s %-10s %-12s %s\n' ranks wall_s base_s ratio cpu_s base_cpu_s cpu_ratio \
  RSS_MB base_RSS_MB RSS_ratio summary_KB/f verdict
for n in "${sizes[@]}"; do
  dir=$cache/$n-$scenario${ring:+-ring$ring}
  if [ ! -f "$dir/.complete" ]; then
    rm -rf "$dir"
    mkdir -p "$dir"
    "$bin/ncclwatch-gen" --ranks "$n" --scenario "$scenario" ${ring:+--ring "$ring"} --culprit $((7 * n / 11)) \
      --out "$dir" >&2
    touch "$dir/.complete"
  fi
  run_once "$bin/ncclwatch" "$dir" >/dev/null  # warms the page cache
  new=() old=()
  for ((r = 0; r < runs; r++)); do  # alternating, so that both builds see the same load
    new+=("$(run_once "$bin/ncclwatch" "$dir")")
    [ -z "$base" ] || old+=("$(run_once "$base/ncclwatch" "$dir")")
  done
  wall=$(printf '%s\n' "${new[@]}" | cut -d' ' -f1 | median)
  rss=$(printf '%s\n' "${new[@]}" | cut -d' ' -f2 | median)
  cpu=$(printf '%s\n' "${new[@]}" | cut -d' ' -f3 | median)
  verdict=$(printf '%s\n' "${new[0]}" | cut -d' ' -f4-)
  bwall=- brss=- bcpu=- ratio=- rss_ratio=- cpu_ratio=-
  if [ -n "$base" ]; then
    bwall=$(printf '%s\n' "${old[@]}" | cut -d' ' -f1 | median)
    brss=$(printf '%s\n' "${old[@]}" | cut -d' ' -f2 | median)
    bcpu=$(printf '%s\n' "${old[@]}" | cut -d' ' -f3 | median)
    cpu_ratio=$(awk -v a="$cpu" -v b="$bcpu" 'BEGIN{printf "%.2f", a/b}')
    ratio=$(awk -v a="$wall" -v b="$bwall" 'BEGIN{printf "%.2f", a/b}')
    rss_ratio=$(awk -v a="$rss" -v b="$brss" 'BEGIN{printf "%.2f", a/b}')
    bverdict=$(printf '%s\n' "${old[0]}" | cut -d' ' -f4-)
    [ "$bverdict" = "$verdict" ] || verdict="$verdict (baseline: $bverdict)"
  fi
  # Bytes of summaries read per file, from --verbose's statistics line when there is one.
  per_file=$(sed -n 's/.*ncclwatch: \([0-9]*\) files.*read \([0-9]*\) bytes of summaries.*/\1 \2/p' "$dir.err" |
    awk '{if ($1 > 0) printf "%.1f", $2 / $1 / 1024}')
  rm -f "$dir.err"
  printf '%-7s %-10s %-10s %-10s %-10s %-10s %-10s %-11s %-11s %-10s %-12s %s\n' "$n" "$wall" "$bwall" "$ratio" "$cpu" "$bcpu" \
    "$cpu_ratio" "$rss" "$brss" \
    "$rss_ratio" "${per_file:--}" "$verdict"
  echo "#   $n this build: $(printf '%s; ' "${new[@]}")${base:+baseline: $(printf '%s; ' "${old[@]}")}"
done
