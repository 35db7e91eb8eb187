// The library's own cost per intercepted operation, over the GPU-free simulator, against the
// same calls without the library, in one run (bench/run_bench.sh runs it and prints medians
// and ratios):
//   Direct/...   : the simulator's ncclAllReduce called directly (the baseline)
//   Wrapped/...  : the same call through libncclwatch.so's ncclAllReduce (dlopen'ed here)
// Two regimes:
//   issue/... : the cost of issuing the call on the calling thread. The simulated GPU (the
//               stream's worker) is held behind a gate while a batch is issued and released
//               between batches, outside the timing, as a real GPU runs asynchronously on
//               its own hardware. This is the headline figure.
//   flow/...  : the stream's worker executes concurrently; on 2 cores its lock (one mutex in
//               the simulated driver) is contended by every driver call, so this includes the
//               simulator's own contention. Reported for transparency.
// The ".../deep" variants issue the call from 40 frames down, as a framework does, since the
// call-site capture costs more with depth. Call-site capture is on or off per process
// (NCCLWATCH_CALLSITES), so run_bench.sh runs this binary once for each.
#include <benchmark/benchmark.h>
#include <dlfcn.h>

#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>

#include "ncclwatch/cuda_abi.h"
#include "ncclwatch/nccl_abi.h"
#include "record/op_record.h"

namespace {

using AllReduceFn = ncclResult_t (*)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t,
                                     cudaStream_t);

struct Setup {
  ncclComm_t comm = nullptr;
  CUstream stream = nullptr;
  CUdeviceptr buf = 0;
  AllReduceFn direct = nullptr;
  AllReduceFn wrapped = nullptr;
  Setup() {
    setenv("NCCLWATCH_DIR", "/tmp/ncclwatch-bench-dumps", 0);
    cuInit(0);
    CUcontext ctx;
    cuDevicePrimaryCtxRetain(&ctx, 0);
    cuCtxSetCurrent(ctx);
    cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING);
    cuMemAlloc(&buf, 64);
    direct = &ncclAllReduce;  // the simulator's: libncclwatch is loaded RTLD_LOCAL below
    void* lib = dlopen(NCCLWATCH_PRELOAD_PATH, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
      fprintf(stderr, "cannot load %s: %s\n", NCCLWATCH_PRELOAD_PATH, dlerror());
      exit(2);
    }
    wrapped = reinterpret_cast<AllReduceFn>(dlsym(lib, "ncclAllReduce"));
    using InitFn = ncclResult_t (*)(ncclComm_t*, int, ncclUniqueId, int);
    using IdFn = ncclResult_t (*)(ncclUniqueId*);
    auto get_id = reinterpret_cast<IdFn>(dlsym(lib, "ncclGetUniqueId"));
    auto init = reinterpret_cast<InitFn>(dlsym(lib, "ncclCommInitRank"));  // so ncclwatch knows the comm
    ncclUniqueId id;
    if (!direct || !wrapped || !get_id || !init) {
      fprintf(stderr, "simulator setup failed: NCCL functions not found\n");
      exit(2);
    }
    ncclResult_t r1 = get_id(&id), r2 = r1 == ncclSuccess ? init(&comm, 1, id, 0) : ncclInvalidUsage;
    if (r1 != ncclSuccess || r2 != ncclSuccess) {
      fprintf(stderr, "simulator setup failed: ncclGetUniqueId %d, ncclCommInitRank %d\n", r1, r2);
      exit(2);
    }
  }
};

Setup& Env() {
  static Setup s;
  return s;
}

// Issues one all-reduce `depth` frames below the benchmark loop.
__attribute__((noinline)) ncclResult_t CallAt(int depth, AllReduceFn fn, Setup& s) {
  if (depth > 0) {
    ncclResult_t r = CallAt(depth - 1, fn, s);
    benchmark::DoNotOptimize(r);
    return r;
  }
  auto p = reinterpret_cast<void*>(s.buf);
  return fn(p, p, 1, ncclFloat32, ncclSum, s.comm, reinterpret_cast<cudaStream_t>(s.stream));
}

// A host function that holds the stream until released: the simulated GPU is busy. Its
// worker sleeps until then (no polling: a thread waking every few microseconds would take
// turns on the calling thread's core, and the noise would swamp the figures on 2 cores).
std::mutex g_gate_mu;
std::condition_variable g_gate_cv;
bool g_gate_open = true;
void Gate(void*) {
  std::unique_lock<std::mutex> lock(g_gate_mu);
  g_gate_cv.wait(lock, [] { return g_gate_open; });
}
void CloseGate(Setup& s) {
  {
    std::lock_guard<std::mutex> lock(g_gate_mu);
    g_gate_open = false;
  }
  cuLaunchHostFunc(s.stream, &Gate, nullptr);
}
void OpenGateAndDrain(Setup& s) {
  {
    std::lock_guard<std::mutex> lock(g_gate_mu);
    g_gate_open = true;
  }
  g_gate_cv.notify_all();
  cuStreamSynchronize(s.stream);
}

constexpr int64_t kBatch = 128;  // operations in flight at once, as in a training step

void Run(benchmark::State& state, bool wrapped, int depth, bool gated) {
  Setup& s = Env();
  AllReduceFn fn = wrapped ? s.wrapped : s.direct;
  int64_t n = 0;
  if (gated) CloseGate(s);
  for (auto _ : state) {
    if (CallAt(depth, fn, s) != ncclSuccess) state.SkipWithError("ncclAllReduce failed");
    if ((++n % kBatch) != 0) continue;
    if (gated) {
      state.PauseTiming();
      OpenGateAndDrain(s);
      CloseGate(s);
      state.ResumeTiming();
    } else {
      cuStreamSynchronize(s.stream);  // keep the simulated stream short; the same for both variants
    }
  }
  if (gated) OpenGateAndDrain(s);
  cuStreamSynchronize(s.stream);
  state.counters["ring_bytes"] = static_cast<double>(sizeof(ncclwatch::OpSlot) * 4096);
}

#define NCCLWATCH_BENCH(name, wrapped, depth, gated) \
  void BM_##name(benchmark::State& st) { Run(st, wrapped, depth, gated); }
NCCLWATCH_BENCH(IssueDirect, false, 0, true)
NCCLWATCH_BENCH(IssueWrapped, true, 0, true)
NCCLWATCH_BENCH(IssueDirectDeep, false, 40, true)
NCCLWATCH_BENCH(IssueWrappedDeep, true, 40, true)
NCCLWATCH_BENCH(FlowDirect, false, 0, false)
NCCLWATCH_BENCH(FlowWrapped, true, 0, false)
#undef NCCLWATCH_BENCH

}  // namespace

BENCHMARK(BM_IssueDirect)->Name("issue/Direct/shallow");
BENCHMARK(BM_IssueWrapped)->Name("issue/Wrapped/shallow");
BENCHMARK(BM_IssueDirectDeep)->Name("issue/Direct/deep");
BENCHMARK(BM_IssueWrappedDeep)->Name("issue/Wrapped/deep");
BENCHMARK(BM_FlowDirect)->Name("flow/Direct/shallow");
BENCHMARK(BM_FlowWrapped)->Name("flow/Wrapped/shallow");
BENCHMARK_MAIN();
