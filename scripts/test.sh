#!/usr/bin/env bash
# The whole test suite: unit, simulator and end-to-end tests, then the same unit tests under
# AddressSanitizer + UndefinedBehaviorSanitizer, and the recorder/watchdog/stack tests under
# ThreadSanitizer. Exit status 0 only if everything passed.
#   scripts/test.sh            everything
#   scripts/test.sh --quick    the main build's tests only
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)
scripts/build.sh build
echo "== tests (build/)"
ctest --test-dir build --output-on-failure -j "$jobs" -LE e2e
# End-to-end cases mostly wait on their ranks: twice as many side by side as there are cores
# (each has its own directories; the ones that measure time run alone, RUN_SERIAL).
ctest --test-dir build --output-on-failure -j "$((jobs * 2 > 4 ? jobs * 2 : 4))" -L e2e
[ "${1:-}" = "--quick" ] && exit 0

sanitized() {  # NAME SANITIZERS CTEST_REGEX TARGETS...
  local dir=build-$1 san=$2 regex=$3
  shift 3
  cmake -S . -B "$dir" -DNCCLWATCH_SANITIZE="$san" -DNCCLWATCH_BUILD_BENCH=OFF -DCMAKE_BUILD_TYPE=Debug >/dev/null
  cmake --build "$dir" -j "$jobs" --target "$@"
  echo "== tests under $san ($dir/)"
  ctest --test-dir "$dir" --output-on-failure -j "$jobs" -R "$regex"
}
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
export LSAN_OPTIONS=suppressions=$PWD/tests/lsan.supp:print_suppressions=0
sanitized asan "address;undefined" '^(core:|format:|stacks:|sim_cuda\.|sim_nccl:|analyzer:)' \
  test_core test_format test_stacks test_sim_cuda test_sim_nccl analyzer_tests
export TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1
sanitized tsan thread '^(core:|stacks:)' test_core test_stacks
