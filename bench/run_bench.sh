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
# are the medians over processes of each process's medians (bench/overheads.py).
#   bench/run_bench.sh [BUILD_DIR] [REPETITIONS] [PROCESSES]
set -euo pipefail
here=$(dirname "$0")
. "$here/intercept_common.sh"
build=${1:-build}
reps=${2:-5}
procs=${3:-5}
intercept_bin "$build" >/dev/null || exit 2
export NCCLWATCH_DIR=$(mktemp -d)
out=$(mktemp -d)
trap 'rm -rf "$NCCLWATCH_DIR" "$out"' EXIT

run_config() {  # NAME CPU(empty: all) FILTER, then environment assignments
  local name=$1 cpu=$2 filter=$3
  shift 3
  for p in $(seq "$procs"); do
    run_intercept "$build" "$out/$name.$p.json" "$filter" "$reps" "$cpu" "$@"
  done
}
one_cpu=$(( $(nproc) - 1 ))
run_config on "" . NCCLWATCH_CALLSITES=1
run_config off "" . NCCLWATCH_CALLSITES=0
run_config nomarkers "" . NCCLWATCH_CALLSITES=1 NCCLWATCH_CUDA_LIB=/nonexistent/libcuda.so.1
run_config on1cpu "$one_cpu" 'issue/' NCCLWATCH_CALLSITES=1
run_config off1cpu "$one_cpu" 'issue/' NCCLWATCH_CALLSITES=0

python3 "$here/overheads.py" "$out" --cores "$(nproc)" \
  "on=call-site stacks on" "off=call-site stacks off" \
  "nomarkers=call-site stacks on, GPU markers off (own CPU path only)" \
  "on1cpu=call-site stacks on, one CPU (the library's whole CPU cost)" \
  "off1cpu=call-site stacks off, one CPU"
