// What ncclwatch's three driver calls per operation cost in the simulator by themselves: a
// capture check and two cuEventRecord on a busy stream (the GPU held behind a gate, as in
// bench_intercept's issue regime), cycling through N event pairs in a shuffled order. N is how
// many operations are in flight between a marker's use and its reuse: small when the watchdog
// gives markers back quickly, thousands at a million operations a second. The spread between
// small and large N is memory traffic on the event objects, not work.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <random>
#include <thread>
#include <vector>

#include "ncclwatch/cuda_abi.h"

namespace {

std::atomic<bool> g_gate_open{true};
void Gate(void*) {
  while (!g_gate_open.load(std::memory_order_acquire)) std::this_thread::sleep_for(std::chrono::microseconds(50));
}

void BM_MarkerCalls(benchmark::State& state) {
  const size_t pairs = static_cast<size_t>(state.range(0));
  static CUstream stream = [] {
    cuInit(0);
    CUcontext ctx;
    cuDevicePrimaryCtxRetain(&ctx, 0);
    cuCtxSetCurrent(ctx);
    CUstream s;
    cuStreamCreate(&s, CU_STREAM_NON_BLOCKING);
    return s;
  }();
  std::vector<CUevent> events(2 * pairs);
  for (CUevent& e : events) cuEventCreate(&e, CU_EVENT_DISABLE_TIMING);
  std::vector<size_t> order(pairs);
  for (size_t i = 0; i < pairs; ++i) order[i] = i;
  std::shuffle(order.begin(), order.end(), std::mt19937(7));
  size_t k = 0;
  int64_t in_batch = 0;
  g_gate_open = false;
  cuLaunchHostFunc(stream, &Gate, nullptr);
  for (auto _ : state) {
    CUstreamCaptureStatus status;
    cuStreamIsCapturing(stream, &status);
    const size_t pair = order[k++ % pairs];
    cuEventRecord(events[2 * pair], stream);
    cuEventRecord(events[2 * pair + 1], stream);
    if (++in_batch == 128) {  // let the simulated GPU catch up, outside the timing
      state.PauseTiming();
      g_gate_open = true;
      cuStreamSynchronize(stream);
      g_gate_open = false;
      cuLaunchHostFunc(stream, &Gate, nullptr);
      in_batch = 0;
      state.ResumeTiming();
    }
  }
  g_gate_open = true;
  cuStreamSynchronize(stream);
  for (CUevent e : events) cuEventDestroy(e);
}

}  // namespace

BENCHMARK(BM_MarkerCalls)->Arg(16)->Arg(512)->Arg(4096)->Arg(16384);
BENCHMARK_MAIN();
