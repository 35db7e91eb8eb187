#!/usr/bin/env bash
# Compares ncclwatch's overhead per intercepted call between two builds (say, main and a
# change), alternating processes of one and the other so that both see the same machine load:
#   bench/compare_builds.sh BUILD_A BUILD_B [PAIRS] [FILTER]
# Each process runs bench_intercept's direct and wrapped calls (FILTER, default the issue regime,
# shallow) with 3 repetitions interleaved at random, and yields its own overhead (wrapped median
# minus direct median). Prints every process's overhead and the median per build.
# Call-site stacks are on (the default configuration); set NCCLWATCH_CALLSITES=0 to compare with
# them off. PIN=CPU runs every process on that one CPU (taskset): all of the library's threads
# then take their time from the calling thread's wall time, and no cache line moves between
# cores, which makes the figures steadier (see docs/performance.md). A_ENV and B_ENV add
# variables to one side only, which compares two configurations of one build:
#   A_ENV=NCCLWATCH_CALLSITES=1 B_ENV=NCCLWATCH_CALLSITES=0 bench/compare_builds.sh build build
set -euo pipefail
a=${1:?BUILD_A}
b=${2:?BUILD_B}
pairs=${3:-8}
filter=${4:-issue/.*/shallow}
out=$(mktemp -d)
export NCCLWATCH_DIR=$(mktemp -d)
trap 'rm -rf "$out" "$NCCLWATCH_DIR"' EXIT

run() {  # BUILD OUTPUT EXTRA_ENV
  ${PIN:+taskset -c "$PIN"} env ${3:-} LD_LIBRARY_PATH="$1/sim" "$1/bin/bench_intercept" --benchmark_filter="$filter" \
    --benchmark_repetitions=3 --benchmark_report_aggregates_only=true \
    --benchmark_enable_random_interleaving=true --benchmark_min_time=0.15 \
    --benchmark_format=json > "$2" 2>/dev/null
}
for p in $(seq "$pairs"); do
  # Alternate which build goes first, so neither always runs right after the other.
  if (( p % 2 )); then run "$a" "$out/a.$p.json" "${A_ENV:-}"; run "$b" "$out/b.$p.json" "${B_ENV:-}"
  else run "$b" "$out/b.$p.json" "${B_ENV:-}"; run "$a" "$out/a.$p.json" "${A_ENV:-}"; fi
done

python3 - "$out" "$a ${A_ENV:-}" "$b ${B_ENV:-}" <<'PY'
import glob, json, os, statistics, sys
out, names = sys.argv[1], {"a": sys.argv[2].strip(), "b": sys.argv[3].strip()}
for key, name in names.items():
    per = {}
    for path in sorted(glob.glob(os.path.join(out, key + ".*.json"))):
        med = {b["run_name"]: b["real_time"] for b in json.load(open(path))["benchmarks"]
               if b.get("aggregate_name") == "median"}
        for run, t in med.items():
            if "/Wrapped/" in run and run.replace("/Wrapped/", "/Direct/") in med:
                d = med[run.replace("/Wrapped/", "/Direct/")]
                per.setdefault(run.replace("/Wrapped", ""), []).append((d, t, t - d))
    for run, rows in per.items():
        o = statistics.median(r[2] for r in rows)
        d = statistics.median(r[0] for r in rows)
        print(f"{key} {name}: {run:14s} direct {d:6.0f} ns  overhead median {o:6.0f} ns  "
              f"(per process: {' '.join(f'{r[2]:.0f}' for r in rows)})")
PY
