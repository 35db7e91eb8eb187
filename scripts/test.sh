#!/usr/bin/env bash
# The whole test suite: unit, simulator and end-to-end tests, then the same unit tests under
# AddressSanitizer + UndefinedBehaviorSanitizer, and the recorder/watchdog/stack tests under
# ThreadSanitizer. Exit status 0 only if everything passed.
#   scripts/test.sh            everything
#   scripts/test.sh --quick    the main build's tests only
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)
quick=false
# Each stage's line says when it began, counted from the start of this script.
stage() { echo "== $* [$(date +%T), $((SECONDS / 60)) min $((SECONDS % 60)) s in]"; }
[ "${1:-}" = "--quick" ] && quick=true
source scripts/cmake-env.sh
scripts/build.sh build

# tests/CMakeLists.txt: the programs of the unit tests each runs (the -R prefixes below).
asan_targets=(unit_test_programs)
tsan_targets=(thread_test_programs)
sanitizer_build() {  # NAME SANITIZERS JOBS TARGETS...
  local dir=build-$1 san=$2 j=$3
  shift 3
  # Line tables only (-g1; the stack tests' programs keep -g): a report still names file:line
  # in every frame, at a tenth less compile time.
  cmake -S . -B "$dir" -DNCCLWATCH_SANITIZE="$san" -DNCCLWATCH_BUILD_BENCH=OFF -DCMAKE_BUILD_TYPE=Debug \
    -DCMAKE_C_FLAGS_DEBUG=-g1 -DCMAKE_CXX_FLAGS_DEBUG=-g1 >/dev/null
  cmake --build "$dir" -j "$j" --target "$@"
}
# The sanitizer builds run while the main tests do, as many compiles as cores at the normal
# priority: the tests mostly wait on their ranks. (With one compile, beside two busy loops the
# ASan build was three quarters done when the tests were, and its last quarter then came before
# its tests; at nice 19 on a machine that others load, the builds got no CPU at all until the
# tests were done.) ASan first, its tests are the longer ones; the TSan build starts when the
# ASan build or the main tests are done, whichever comes first, and goes on while the ASan
# tests run. Once the main tests are done, a build still going on is stopped and continued with
# all the jobs (make keeps what it compiled, and deletes what it was writing).
sanitizers_log=build/sanitizers.log
asan_built=build/.asan-built
main_tested=build/.main-tested
if ! $quick; then
  rm -f "$asan_built" "$main_tested"
  set -m  # each background build in a process group of its own, stopped whole
  (sanitizer_build asan "address;undefined" "$jobs" "${asan_targets[@]}" && touch "$asan_built") >"$sanitizers_log.asan" 2>&1 &
  asan=$!
  (while [ ! -e "$asan_built" ] && [ ! -e "$main_tested" ] && kill -0 "$asan" 2>/dev/null; do sleep 1; done
   sanitizer_build tsan thread "$jobs" "${tsan_targets[@]}") >"$sanitizers_log.tsan" 2>&1 &
  tsan=$!
  set +m
  trap 'kill -- -"$asan" -"$tsan" 2>/dev/null || true' EXIT
fi
# finish_build NAME PID SANITIZERS TARGETS...: the background build NAME, finished with all the
# jobs when it is still going on; fails when it failed.
finish_build() {
  local name=$1 pid=$2 san=$3
  shift 3
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM -- -"$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    echo "test.sh: the tests are done: the $name build goes on with $((jobs + 2)) jobs" >>"$sanitizers_log.$name"
    sanitizer_build "$name" "$san" "$((jobs + 2))" "$@" >>"$sanitizers_log.$name" 2>&1
  else
    wait "$pid"
  fi
}

# The sanitizer runs' first schedule: the main run's times (ctest starts the longest tests first
# when it knows their times; the names are the same), unless they have times of their own.
seed_costs() {  # BUILD_DIR
  local d=$1/Testing/Temporary
  [ -e "$d/CTestCostData.txt" ] || { mkdir -p "$d" && cp build/Testing/Temporary/CTestCostData.txt "$d/"; } 2>/dev/null || true
}

# Every run fails when a test left a new entry in / (tests write only in their temporary directories).
inside() { tests/support/root_unchanged.sh "$@"; }

# One test more than cores: some wait (the installation's, the simulator's), and on a machine
# that others load, N+1 of ours get more of it than N.
stage "tests (build/)"
inside ctest --test-dir build --output-on-failure -j "$((jobs + 1))" -LE e2e
stage "end-to-end tests (build/, label e2e)"
# End-to-end cases mostly wait on their ranks: three times as many side by side as there are
# cores (each has its own directories; the ones that measure time run alone, RUN_SERIAL).
inside ctest --test-dir build --output-on-failure -j "$((jobs * 3 > 6 ? jobs * 3 : 6))" -L e2e
$quick && exit 0

stage "sanitizer builds (build-asan/, build-tsan/; logs: $sanitizers_log.asan, .tsan)"
touch "$main_tested"
sanitizer_failed() {  # NAME
  cat "$sanitizers_log.$1"
  echo "test.sh: the $1 build failed (above)" >&2
  exit 1
}
finish_build asan "$asan" "address;undefined" "${asan_targets[@]}" || sanitizer_failed asan
# intercept_tls_get_addr=0: LeakSanitizer's tracer (GCC 12) read a garbage entry of the dynamic
# TLS of libdw (opened at run time by the source-line tests) and crashed at exit, depending on
# the binary's layout; without it no dynamic TLS is tracked (none of ours: nothing is dlopen'd
# but libdw and the simulator).
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:intercept_tls_get_addr=0 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
export LSAN_OPTIONS=suppressions=$PWD/tests/lsan.supp:print_suppressions=0
stage "tests under address;undefined (build-asan/)"
seed_costs build-asan
inside ctest --test-dir build-asan --output-on-failure -j "$((jobs + 1))" -R '^(core:|format:|stacks:|sim_cuda\.|sim_nccl:|analyzer:)'
finish_build tsan "$tsan" thread "${tsan_targets[@]}" || sanitizer_failed tsan
trap - EXIT
export TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1
stage "tests under thread (build-tsan/)"
seed_costs build-tsan
inside ctest --test-dir build-tsan --output-on-failure -j "$((jobs + 1))" -R '^(core:|stacks:)'
stage "all passed"
