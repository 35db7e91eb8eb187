// Cost of CaptureCallsite on the hot path: the same call site again and again (what a training
// loop does), reached through ~20 frames of calls, at depths 8, 16 and 32. Run with
// --benchmark_repetitions for medians. The recursion alone is measured too, to subtract.
#define UNW_LOCAL_ONLY
#include <libunwind.h>

#include <benchmark/benchmark.h>

#include "stacks.h"

namespace {

constexpr int kCallerFrames = 20;

using Leaf = int32_t (*)(int depth);

__attribute__((noinline)) int32_t Descend(int levels, Leaf leaf, int depth) {
  if (levels == 0) return leaf(depth);
  const int32_t result = Descend(levels - 1, leaf, depth);
  benchmark::DoNotOptimize(result);  // keeps every level a real frame
  return result;
}

int32_t Capture(int depth) { return ncclwatch::stacks::CaptureCallsite(0, depth); }

int32_t Unwind(int depth) {
  void* frames[ncclwatch::stacks::kMaxNativeFrames + 2];
  return unw_backtrace(frames, depth + 1);
}

int32_t Nothing(int depth) { return depth; }

void BM_CaptureCallsite(benchmark::State& state) {
  const int depth = static_cast<int>(state.range(0));
  if (Descend(kCallerFrames, Capture, depth) < 0) state.SkipWithError("capture failed");
  for (auto _ : state) benchmark::DoNotOptimize(Descend(kCallerFrames, Capture, depth));
}

void BM_UnwBacktraceOnly(benchmark::State& state) {
  const int depth = static_cast<int>(state.range(0));
  for (auto _ : state) benchmark::DoNotOptimize(Descend(kCallerFrames, Unwind, depth));
}

void BM_CallerFramesOnly(benchmark::State& state) {
  for (auto _ : state) benchmark::DoNotOptimize(Descend(kCallerFrames, Nothing, 0));
}

}  // namespace

BENCHMARK(BM_CaptureCallsite)->Arg(8)->Arg(16)->Arg(32);
BENCHMARK(BM_CaptureCallsite)->Arg(16)->Threads(2)->UseRealTime();
BENCHMARK(BM_UnwBacktraceOnly)->Arg(8)->Arg(16)->Arg(32);
BENCHMARK(BM_CallerFramesOnly);
BENCHMARK_MAIN();
