#!/usr/bin/env bash
# Counts the file-system calls that reach the shared dump directory while a job is idle, per
# host and per second, with the per-host relay (NCCLWATCH_RELAY_DIR, default) and without it
# (NCCLWATCH_RELAY_DIR=none: every rank reads the shared directory):
#   bench/relay_fs_calls.sh [BUILD] [RANKS] [HOSTS] [SECONDS]
# Defaults: build, 16 ranks, 2 simulated hosts (8 ranks per host), 10 s idle, the default
# NCCLWATCH_PEER_POLL_MS (1 s). Needs strace. Counts every traced call whose path argument is
# inside the dump directory (stat, open, ...), over the whole run, divided by hosts and seconds.
set -euo pipefail
build=${1:-build}
ranks=${2:-16}
hosts=${3:-2}
secs=${4:-10}
command -v strace >/dev/null || { echo "relay_fs_calls.sh: needs strace (apt-get install strace)" >&2; exit 2; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

count() {  # RELAY_DIR -> calls per host per second
  local dumps="$work/dumps-$1" trace="$work/trace-$1"
  mkdir -p "$dumps" "$work/relay"
  local relay=$1
  [ "$relay" = on ] && relay="$work/relay" || relay=none
  NCCLWATCH_DIR="$dumps" NCCLWATCH_RELAY_DIR="$relay" NCCLWATCH_EXIT_RECORD=0 \
    LD_PRELOAD="$build/lib/libncclwatch.so" \
    strace -f -qq -o "$trace" -e trace=%file,%stat \
    "$build/bin/simlaunch" -n "$ranks" --hosts "$hosts" --quiet -- \
    "$build/bin/sim_workload" --iters 3 --linger-ms "$((secs * 1000))" >/dev/null
  local calls
  calls=$(grep -c -- "\"$dumps" "$trace" || true)
  awk -v c="$calls" -v h="$hosts" -v s="$secs" 'BEGIN { printf "%.1f", c / h / s }'
}

off=$(count off)
on=$(count on)
echo "shared dump directory, file-system calls per host per second ($ranks ranks, $hosts hosts, ${secs} s idle):"
echo "  relay off (every rank reads it): $off"
echo "  relay on (one reader per host):  $on"
