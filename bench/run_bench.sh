#!/usr/bin/env bash
# Runs bench_intercept with call-site stacks on and off, and prints per-call medians and the
# library's overhead against the direct calls measured in the same run.
#   bench/run_bench.sh [BUILD_DIR] [REPETITIONS]
set -euo pipefail
build=${1:-build}
reps=${2:-9}
bin="$build/bench/bench_intercept"
[ -x "$bin" ] || bin="$build/bin/bench_intercept"
[ -x "$bin" ] || { echo "bench_intercept not built (needs Google Benchmark: apt-get install libbenchmark-dev)"; exit 2; }
export LD_LIBRARY_PATH="$build/sim${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export NCCLWATCH_DIR=$(mktemp -d)
trap 'rm -rf "$NCCLWATCH_DIR"' EXIT
for callsites in 1 0; do
  out=$(mktemp)
  NCCLWATCH_CALLSITES=$callsites "$bin" --benchmark_repetitions="$reps" --benchmark_report_aggregates_only=true \
    --benchmark_format=json --benchmark_min_time=0.2 --benchmark_enable_random_interleaving=true > "$out" 2>/dev/null
  python3 - "$out" "$callsites" <<'PY'
import json, sys
data = json.load(open(sys.argv[1]))
med = {b["run_name"]: b["real_time"] for b in data["benchmarks"] if b.get("aggregate_name") == "median"}
ring = next((b.get("ring_bytes") for b in data["benchmarks"] if "ring_bytes" in b), None)
print(f"call-site stacks {'on' if sys.argv[2] == '1' else 'off'} (median of {data['benchmarks'][0].get('repetitions', '?')} runs, ns per call):")
for regime in ("issue", "flow"):
    for depth in ("shallow", "deep"):
        d, w = med.get(f"{regime}/Direct/{depth}"), med.get(f"{regime}/Wrapped/{depth}")
        if d is None or w is None: continue
        print(f"  {regime:5s} {depth:8s} direct {d:8.1f}  wrapped {w:8.1f}  overhead {w - d:7.1f} ns  ratio {w / d:5.2f}")
if ring: print(f"  ring resident memory (4096 entries): {ring / 1024:.0f} KiB")
PY
  rm -f "$out"
done
