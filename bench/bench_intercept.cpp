// The library's own cost per intercepted operation, over the GPU-free simulator, against the
// same calls without the library, in one run (bench/run_bench.sh runs it and prints medians
// and ratios):
//   Direct/...   : the simulator's ncclAllReduce called directly (the baseline)
//   Wrapped/...  : the same call through libncclwatch.so's ncclAllReduce (dlopen'ed here)
// The ".../deep" variants issue the call from 40 frames down, as a framework does, since the
// call-site capture costs more with depth. Call-site capture is on or off per process
// (NCCLWATCH_CALLSITES), so run_bench.sh runs this binary once for each.
#include <benchmark/benchmark.h>
#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
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

void Run(benchmark::State& state, bool wrapped, int depth) {
  Setup& s = Env();
  AllReduceFn fn = wrapped ? s.wrapped : s.direct;
  int64_t n = 0;
  for (auto _ : state) {
    if (CallAt(depth, fn, s) != ncclSuccess) state.SkipWithError("ncclAllReduce failed");
    // Keep the simulated stream short; the same for both variants.
    if ((++n & 255) == 0) cuStreamSynchronize(s.stream);
  }
  cuStreamSynchronize(s.stream);
  state.counters["ring_bytes"] = static_cast<double>(sizeof(ncclwatch::OpSlot) * 4096);
}

void BM_Direct(benchmark::State& st) { Run(st, false, 0); }
void BM_Wrapped(benchmark::State& st) { Run(st, true, 0); }
void BM_DirectDeep(benchmark::State& st) { Run(st, false, 40); }
void BM_WrappedDeep(benchmark::State& st) { Run(st, true, 40); }

}  // namespace

BENCHMARK(BM_Direct)->Name("Direct/shallow");
BENCHMARK(BM_Wrapped)->Name("Wrapped/shallow");
BENCHMARK(BM_DirectDeep)->Name("Direct/deep");
BENCHMARK(BM_WrappedDeep)->Name("Wrapped/deep");
BENCHMARK_MAIN();
