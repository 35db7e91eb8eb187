#!/usr/bin/env bash
# Runs bench_intercept and prints the library's overhead per intercepted call against the
# direct calls measured in the same process:
#   1. call-site stacks on (the default configuration)
#   2. call-site stacks off
#   3. call-site stacks on, GPU markers off (NCCLWATCH_CUDA_LIB pointing nowhere): ncclwatch's
#      own CPU path alone, without the three driver calls per operation
#   4. and 5. call-site stacks on, then off, with the whole process on one CPU (taskset), issue
#      regime only: the watchdog's work then counts in the calling thread's wall time, and no
#      cache line moves between cores (on 2 cores the simulator's stream worker, which runs
#      the batch between timed stretches, leaves every line it touched on the other core). The
#      steadiest figure: the library's whole CPU cost per operation.
# The machine is shared and noisy, and a process's own layout (addresses, thread placement)
# shifts its figures, so each configuration runs in PROCESSES separate processes, each with
# REPETITIONS repetitions interleaved at random between direct and wrapped calls; the figures
# are the medians over processes of each process's medians.
#   bench/run_bench.sh [BUILD_DIR] [REPETITIONS] [PROCESSES]
set -euo pipefail
build=${1:-build}
reps=${2:-5}
procs=${3:-5}
bin="$build/bench/bench_intercept"
[ -x "$bin" ] || bin="$build/bin/bench_intercept"
[ -x "$bin" ] || { echo "bench_intercept not built (needs Google Benchmark: apt-get install libbenchmark-dev)"; exit 2; }
export LD_LIBRARY_PATH="$build/sim${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export NCCLWATCH_DIR=$(mktemp -d)
out=$(mktemp -d)
trap 'rm -rf "$NCCLWATCH_DIR" "$out"' EXIT

run_config() {  # NAME CPU(empty: all) FILTER, then environment assignments
  local name=$1 cpu=$2 filter=$3
  shift 3
  for p in $(seq "$procs"); do
    ${cpu:+taskset -c "$cpu"} env "$@" "$bin" --benchmark_filter="$filter" \
      --benchmark_repetitions="$reps" --benchmark_report_aggregates_only=true \
      --benchmark_enable_random_interleaving=true --benchmark_min_time=0.15 \
      --benchmark_format=json > "$out/$name.$p.json" 2>/dev/null
  done
}
one_cpu=$(( $(nproc) - 1 ))
run_config on "" . NCCLWATCH_CALLSITES=1
run_config off "" . NCCLWATCH_CALLSITES=0
run_config nomarkers "" . NCCLWATCH_CALLSITES=1 NCCLWATCH_CUDA_LIB=/nonexistent/libcuda.so.1
run_config on1cpu "$one_cpu" 'issue/' NCCLWATCH_CALLSITES=1
run_config off1cpu "$one_cpu" 'issue/' NCCLWATCH_CALLSITES=0

python3 - "$out" "$procs" "$reps" "$(nproc)" <<'PY'
import glob, json, os, statistics, sys
out, procs, reps, cores = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
titles = {"on": "call-site stacks on", "off": "call-site stacks off",
          "nomarkers": "call-site stacks on, GPU markers off (own CPU path only)",
          "on1cpu": "call-site stacks on, one CPU (the library's whole CPU cost)",
          "off1cpu": "call-site stacks off, one CPU"}
print(f"ns per call: medians over {procs} processes of each one's median of {reps} interleaved runs ({cores} cores)")
for config, title in titles.items():
    per = {}
    ring = None
    for path in sorted(glob.glob(os.path.join(out, config + ".*.json"))):
        data = json.load(open(path))
        med = {b["run_name"]: b["real_time"] for b in data["benchmarks"] if b.get("aggregate_name") == "median"}
        ring = ring or next((b.get("ring_bytes") for b in data["benchmarks"] if "ring_bytes" in b), None)
        for regime in ("issue", "flow"):
            for depth in ("shallow", "deep"):
                d, w = med.get(f"{regime}/Direct/{depth}"), med.get(f"{regime}/Wrapped/{depth}")
                if d is None or w is None:
                    continue
                per.setdefault((regime, depth), []).append((d, w, w - d))
    print(f"{title}:")
    for (regime, depth), runs in per.items():
        d = statistics.median(r[0] for r in runs)
        w = statistics.median(r[1] for r in runs)
        o = statistics.median(r[2] for r in runs)
        spread = " ".join(f"{r[2]:.0f}" for r in runs)
        print(f"  {regime:5s} {depth:8s} direct {d:7.1f}  wrapped {w:7.1f}  overhead {o:6.1f}  ratio {w / d:4.2f}   (overhead per process: {spread})")
    if ring:
        print(f"  ring resident memory (4096 entries): {ring / 1024:.0f} KiB")
PY
