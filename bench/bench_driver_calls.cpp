// Driver calls ncclwatch adds per NCCL operation in steady state, counted over the simulator
// (NCCLWATCH_SIM_CUDA_LOG=1: one line per driver call). On a GPU each driver call costs 10 to
// 800 ns (docs/performance.md), so this count is the CPU-side proxy of the per-call cost that
// CI can check: today one capture check and two event records per plain operation, and one
// marker pair per stream for a group.
//   bench_driver_calls [--max-plain X] [--max-group8 Y]
// Plain operations run on one stream, then alternating between two (each stream's context is
// remembered per thread: no lookup per operation either way), then in groups of 8 on one.
// X (plain, both) and Y bound the calls on the calling thread (exact: 3 and 3/8); with either, the
// other threads' calls (the watchdog's event queries) are bounded by kMaxOthers.
// In one process, batches of operations (each followed by a stream synchronization, as a
// training step) go first straight to the simulator's NCCL, then through libncclwatch.so
// (dlopen'ed RTLD_LOCAL, as bench_intercept does), after a warm-up; the difference in driver
// calls, the watchdog's included, divided by the operations, is printed per kind of call.
// With --max-*, exits 1 when a figure is above its bound (tests: the count must not grow).
#include <dlfcn.h>
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <thread>

#include "ncclwatch/cuda_abi.h"
#include "ncclwatch/nccl_abi.h"
#include "common/thread_id.h"
#include "driver_call_log.h"

namespace {

constexpr int kBatch = 64;
constexpr int kBatches = 32;
constexpr int kGroup = 8;
constexpr double kMaxOthers = 0.5;

using AllReduceFn = ncclResult_t (*)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t,
                                     cudaStream_t);
using GroupFn = ncclResult_t (*)();

struct Nccl {
  AllReduceFn all_reduce;
  GroupFn group_start;
  GroupFn group_end;
};

// `ops` operations (alone, or in groups of `group`) in synchronized batches, then time for the
// watchdog (polling every 10 ms) to follow them all. With two streams, consecutive launches
// alternate between them (FSDP's all-gather and reduce-scatter streams).
void Run(const Nccl& n, ncclComm_t comm, const CUstream* streams, int nstreams, CUdeviceptr buf, int group) {
  for (int b = 0; b < kBatches; ++b) {
    for (int i = 0; i < kBatch; i += group) {
      const CUstream stream = streams[(i / group) % nstreams];
      if (group > 1) n.group_start();
      for (int k = 0; k < group; ++k)
        n.all_reduce(reinterpret_cast<void*>(buf), reinterpret_cast<void*>(buf), 1, ncclFloat, ncclSum, comm,
                     reinterpret_cast<cudaStream_t>(stream));
      if (group > 1) n.group_end();
    }
    for (int s = 0; s < nstreams; ++s) cuStreamSynchronize(streams[s]);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
}

}  // namespace

int main(int argc, char** argv) {
  double max_plain = -1, max_group = -1;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--max-plain") == 0) max_plain = std::atof(argv[i + 1]);
    if (std::strcmp(argv[i], "--max-group8") == 0) max_group = std::atof(argv[i + 1]);
  }
  bench::DriverCallLog log;
  if (!log.Open("driver-calls")) return 2;

  cuInit(0);
  CUcontext ctx;
  cuDevicePrimaryCtxRetain(&ctx, 0);
  cuCtxSetCurrent(ctx);
  CUstream streams[2];
  for (CUstream& s : streams) cuStreamCreate(&s, CU_STREAM_NON_BLOCKING);
  CUdeviceptr buf;
  cuMemAlloc(&buf, 64);
  void* lib = dlopen(NCCLWATCH_PRELOAD_PATH, RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    std::fprintf(log.out(), "bench_driver_calls: cannot load %s\n", NCCLWATCH_PRELOAD_PATH);
    return 2;
  }
  const Nccl direct{&ncclAllReduce, &ncclGroupStart, &ncclGroupEnd};
  const Nccl wrapped{reinterpret_cast<AllReduceFn>(dlsym(lib, "ncclAllReduce")),
                     reinterpret_cast<GroupFn>(dlsym(lib, "ncclGroupStart")),
                     reinterpret_cast<GroupFn>(dlsym(lib, "ncclGroupEnd"))};
  auto get_id = reinterpret_cast<ncclResult_t (*)(ncclUniqueId*)>(dlsym(lib, "ncclGetUniqueId"));
  auto init = reinterpret_cast<ncclResult_t (*)(ncclComm_t*, int, ncclUniqueId, int)>(dlsym(lib, "ncclCommInitRank"));
  ncclUniqueId id;
  ncclComm_t comm;
  if (!wrapped.all_reduce || !get_id || !init || get_id(&id) != ncclSuccess || init(&comm, 1, id, 0) != ncclSuccess) {
    std::fprintf(log.out(), "bench_driver_calls: simulator setup failed\n");
    return 2;
  }
  bool over = false;
  const int ops = kBatch * kBatches;
  const long tid = ncclwatch::CurrentTid();
  struct Variant {
    const char* name;
    int group, nstreams;
    double bound;
  };
  const Variant variants[] = {{"plain:", 1, 1, max_plain},
                              {"two streams:", 1, 2, max_plain},
                              {"groups of 8:", kGroup, 1, max_group}};
  for (const Variant& v : variants) {
    const int group = v.group;
    Run(wrapped, comm, streams, v.nstreams, buf, group);  // warm-up: marker pools, call sites, the watchdog's pace
    log.Drain(tid);
    Run(direct, comm, streams, v.nstreams, buf, group);
    auto base = log.Drain(tid);
    Run(wrapped, comm, streams, v.nstreams, buf, group);
    auto with = log.Drain(tid);
    const bench::AddedCalls calls = bench::Added(with, base, ops);
    double mine = calls.mine;
    const double others = calls.others;
    // A marker pool that grows (the watchdog gave markers back later than in the warm-up, as on
    // a loaded machine) creates an event pair in the stream's context: one context lookup and
    // two creations per marker. Not steady state: counted apart.
    auto added = [&](const char* name) { return static_cast<double>(with[name] - base[name]) / ops; };
    const double growth = added("cuEventCreate") * 1.5 + added("cuCtxPushCurrent") + added("cuCtxPopCurrent");
    mine -= growth;
    std::printf("driver calls added per operation, %-13s %.2f on the calling thread, %.2f on others, %.2f growing "
                "the marker pool (%s)\n",
                v.name, mine, others, growth, calls.detail.c_str());
    const double bound = v.bound;
    if (bound >= 0 && mine > bound) {
      std::printf("  above the bound of %.2f: the path every operation takes makes more driver calls\n", bound);
      over = true;
    }
    // The watchdog's queries: a binary search per stream per poll, well under one per operation.
    if (bound >= 0 && others > kMaxOthers) {
      std::printf("  the other threads' calls are above %.2f per operation: the watchdog queries too often\n",
                  kMaxOthers);
      over = true;
    }
  }
  return over ? 1 : 0;
}
