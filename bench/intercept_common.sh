# Sourced by run_bench.sh and compare_builds.sh: how bench_intercept is run (one set of flags)
# and how its runs are reduced (overheads.py), so that both scripts measure the same thing.

# The bench_intercept executable of BUILD, or a line saying why there is none (status 2).
intercept_bin() {  # BUILD
  local bin="$1/bench/bench_intercept"
  [ -x "$bin" ] || bin="$1/bin/bench_intercept"
  [ -x "$bin" ] || { echo "bench_intercept not built in $1 (needs Google Benchmark: apt-get install libbenchmark-dev)" >&2; return 2; }
  echo "$bin"
}

# One process of bench_intercept: REPETITIONS repetitions interleaved at random between the
# direct and the wrapped calls, aggregates only, as JSON into OUTPUT. CPU (empty: all) pins the
# whole process to that CPU; VAR=VALUE arguments go to its environment.
run_intercept() {  # BUILD OUTPUT FILTER REPETITIONS CPU [VAR=VALUE...]
  local build=$1 out=$2 filter=$3 reps=$4 cpu=$5 bin
  shift 5
  bin=$(intercept_bin "$build") || return
  ${cpu:+taskset -c "$cpu"} env LD_LIBRARY_PATH="$build/sim${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$@" \
    "$bin" --benchmark_filter="$filter" --benchmark_repetitions="$reps" \
    --benchmark_report_aggregates_only=true --benchmark_enable_random_interleaving=true \
    --benchmark_min_time=0.15 --benchmark_format=json > "$out" 2>/dev/null
}
