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
[ "${1:-}" = "--quick" ] && quick=true
scripts/build.sh build

asan_targets=(test_core test_format test_stacks test_sim_cuda test_sim_nccl analyzer_tests)
tsan_targets=(test_core test_stacks)
sanitizer_build() {  # NAME SANITIZERS TARGETS...
  local dir=build-$1 san=$2
  shift 2
  cmake -S . -B "$dir" -DNCCLWATCH_SANITIZE="$san" -DNCCLWATCH_BUILD_BENCH=OFF -DCMAKE_BUILD_TYPE=Debug >/dev/null
  cmake --build "$dir" -j "$jobs" --target "$@"
}
# The sanitizer builds run while the main tests do, at the lowest priority: the end-to-end cases
# mostly wait on their ranks, and nice 19 leaves the tests the CPU they ask for.
sanitizers_log=build/sanitizers.log
if ! $quick; then
  (renice -n 19 -p "$BASHPID" >/dev/null
   sanitizer_build asan "address;undefined" "${asan_targets[@]}" && sanitizer_build tsan thread "${tsan_targets[@]}") \
    >"$sanitizers_log" 2>&1 &
  sanitizers=$!
  trap 'kill "$sanitizers" 2>/dev/null || true' EXIT
fi

# Every run fails when a test left a new entry in / (tests write only in their temporary directories).
inside() { tests/support/root_unchanged.sh "$@"; }

echo "== tests (build/)"
inside ctest --test-dir build --output-on-failure -j "$jobs" -LE e2e
# End-to-end cases mostly wait on their ranks: twice as many side by side as there are cores
# (each has its own directories; the ones that measure time run alone, RUN_SERIAL).
inside ctest --test-dir build --output-on-failure -j "$((jobs * 2 > 4 ? jobs * 2 : 4))" -L e2e
$quick && exit 0

echo "== sanitizer builds (build-asan/, build-tsan/; log: $sanitizers_log)"
# The tests are done: the builds get a normal share of the CPU back (where we may raise it).
descendants() { local p; for p in $(pgrep -P "$1" 2>/dev/null); do echo "$p"; descendants "$p"; done; }
renice -n 0 -p "$sanitizers" $(descendants "$sanitizers") >/dev/null 2>&1 || true
if ! wait "$sanitizers"; then
  cat "$sanitizers_log"
  echo "test.sh: a sanitizer build failed (above)" >&2
  exit 1
fi
trap - EXIT
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
export LSAN_OPTIONS=suppressions=$PWD/tests/lsan.supp:print_suppressions=0
echo "== tests under address;undefined (build-asan/)"
inside ctest --test-dir build-asan --output-on-failure -j "$jobs" -R '^(core:|format:|stacks:|sim_cuda\.|sim_nccl:|analyzer:)'
export TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1
echo "== tests under thread (build-tsan/)"
inside ctest --test-dir build-tsan --output-on-failure -j "$jobs" -R '^(core:|stacks:)'
