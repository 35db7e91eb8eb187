#!/usr/bin/env bash
# Regenerates the golden dump sets under golden/ with ncclwatch-gen (through the trace format's
# one writer), each with scenario-truth.json (what a correct analysis says, from how the
# scenario was built), and their expected analyze output (expected.json; expected.txt for a
# few). test_golden.cpp checks expected.json against the truth, not only against itself:
# review `git diff` before committing. The committed sets hold version 1 dumps (written before
# version 2): they prove that version 1 still reads; regenerate a set only when its scenario
# changes.
# usage: tests/analyzer/make_golden.sh [BIN_DIR]   (default build/bin)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bin=${1:-$here/../../build/bin}
golden=$here/golden

# name | generator arguments | text rendering too?
sets=(
  "rank_missing|--ranks 8 --scenario rank_missing|txt"
  "gpu_not_reached|--ranks 8 --scenario gpu_not_reached|"
  "stuck_in_collective|--ranks 4 --scenario stuck_in_collective|"
  "mismatch|--ranks 8 --scenario mismatch|"
  "p2p_unmatched|--ranks 8 --scenario p2p_unmatched|txt"
  "cross_comm_deadlock|--ranks 8 --scenario cross_comm_deadlock|"
  "rank_dead_no_dump|--ranks 8 --scenario rank_dead|"
  "rank_dead_fatal|--ranks 8 --scenario rank_dead --fatal|"
  "rank_exited|--ranks 8 --scenario rank_exited|txt"
  "rank_stopped|--ranks 8 --scenario rank_stopped|txt"
  "extra_call|--ranks 8 --scenario extra_call|txt"
  "job_killed|--ranks 8 --scenario job_killed|txt"
  "host_lost|--ranks 16 --scenario host_lost|txt"
  "nccl_error|--ranks 8 --scenario nccl_error|txt"
  "init_hang|--ranks 4 --scenario init_hang|txt"
  "no_hang|--ranks 8 --scenario no_hang|"
  "mixed|--ranks 8 --tp 2 --scenario mixed|txt"
  "p2p_mismatch|--ranks 8 --ring 32 --scenario p2p_mismatch|txt"
  "p2p_mismatch_dtype|--ranks 4 --scenario p2p_mismatch_dtype|txt"
  "p2p_out_of_order|--ranks 4 --scenario p2p_out_of_order|txt"
  "p2p_missing_recv|--ranks 8 --ring 32 --scenario p2p_missing_recv|txt"
  "p2p_pairing_unknown|--ranks 4 --ring 1 --scenario p2p_pairing_unknown|txt"
  "ring_overflow|--ranks 8 --scenario rank_missing --culprit 2 --ring 1|"
  "two_dumps_one_rank|--ranks 8 --scenario gpu_not_reached --duplicate 5|"
  "corrupt_files|--ranks 8 --scenario rank_missing --truncate 0 --bad-files|"
)
for entry in "${sets[@]}"; do
  IFS='|' read -r name args txt <<<"$entry"
  dir=$golden/$name
  rm -rf "$dir"
  mkdir -p "$dir"
  # Small rings and --lean keep each file a few KB; --ring given in args wins.
  # shellcheck disable=SC2086
  "$bin/ncclwatch-gen" --ring 8 --lean $args --out "$dir" >/dev/null
  echo "ncclwatch-gen --ring 8 --lean $args" >"$dir/generated-by.txt"
  "$bin/ncclwatch" analyze "$dir" --json >"$dir/expected.json" 2>/dev/null || true
  if [ -n "$txt" ]; then
    "$bin/ncclwatch" analyze "$dir" --no-color >"$dir/expected.txt" 2>/dev/null || true
  fi
done
# The set captured from the real library over the simulator (captured-by.txt says how): the
# dumps are captured again, so they are what today's library writes; its scenario-truth.json is
# written by hand from the injected fault and kept.
cap=$golden/sim_gpu_not_reached
lib=$(cd "$bin/../lib" && pwd)/libncclwatch.so
find "$cap" -name 'rank*.json' -delete
NCCLWATCH_DIR=$cap NCCLWATCH_TIMEOUT=3 NCCLWATCH_PEER_POLL_MS=200 \
  NCCLWATCH_SIM_FAULT=kernel:rank=2,seq=6,ms=-1 LD_PRELOAD=$lib \
  "$bin/simlaunch" -n 4 --timeout 8 -- "$bin/sim_workload" --iters 20 >/dev/null 2>&1 || true
rm -f "$cap/dump-request.json"  # the job-wide request: not evidence
"$bin/ncclwatch" analyze "$cap" --json >"$cap/expected.json" 2>/dev/null || true
echo "golden sets written under $golden; review the expected files before committing"
