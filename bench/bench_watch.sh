#!/usr/bin/env bash
# Times `ncclwatch run`'s watch of the dump directory while a big job's dumps come in: the dumps
# of a generated set (bench_scale.sh's CACHE_DIR, ncclwatch-gen --out) are hard-linked into the
# watched directory in batches, as a job's ranks answer a dump request, and the script reports
# how long after the last one the verdict was printed. Not run by ctest.
#
# usage: bench/bench_watch.sh SET_DIR [SECONDS]
#   SET_DIR   a generated dump set
#   SECONDS   how long the dumps take to come in (default 10)
# env: NCCLWATCH_BIN  directory holding ncclwatch (default build/bin)
#      NCCLWATCH_LIB  the libncclwatch.so to pass as --lib (default build/lib/libncclwatch.so)
#      LIMIT          give up this many seconds after the last dump (default 120)
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
bin=${NCCLWATCH_BIN:-$here/../build/bin}
lib=${NCCLWATCH_LIB:-$here/../build/lib/libncclwatch.so}
src=${1:?usage: bench/bench_watch.sh SET_DIR [SECONDS]}
spread=${2:-10}
limit=${LIMIT:-120}

# Next to the set: hard links need the same file system.
work=$(mktemp -d "$(dirname "$src")/watch-XXXXXX")
trap 'kill "$watcher" 2>/dev/null || true; rm -rf "$work"' EXIT
mkdir "$work/dumps"
ls "$src" | grep '^rank.*\.json$' >"$work/names"
total=$(wc -l <"$work/names")
batches=$((spread * 10))
per=$(((total + batches - 1) / batches))
split -l "$per" "$work/names" "$work/batch."

"$bin/ncclwatch" run --lib "$lib" --dir "$work/dumps" -- sleep $((spread + limit + 5)) >"$work/out" 2>"$work/err" &
watcher=$!
sleep 1
start=$(date +%s.%N)
for b in "$work"/batch.*; do
  (cd "$src" && xargs ln -t "$work/dumps" <"$b")
  sleep 0.1
done
last=$(date +%s.%N)
printed=
while [ -z "$printed" ]; do
  if grep -q 'while the job runs' "$work/err"; then printed=$(date +%s.%N); break; fi
  awk -v l="$last" -v n="$(date +%s.%N)" -v m="$limit" 'BEGIN{exit !(n - l > m)}' && break
  sleep 0.2
done
verdict=$(sed -n '0,/^1\. /s/^1\. *\([a-z_]*\) *\(rank[s]* [0-9]*\).*/\1 \2/p' "$work/out" | head -1)
awk -v f="$total" -v s="$start" -v l="$last" -v p="${printed:-}" -v v="${verdict:--}" -v m="$limit" 'BEGIN {
  printf "%d dumps in %.1f s; ", f, l - s
  if (p == "") printf "no verdict within %d s of the last dump\n", m
  else printf "verdict %.1f s after the last dump: %s\n", p - l, v }'
kill -TERM "$watcher" 2>/dev/null || true
wait "$watcher" 2>/dev/null || true
