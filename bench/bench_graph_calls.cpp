// Driver calls ncclwatch adds for an operation captured into a CUDA graph (issue 47), counted over
// the simulator (NCCLWATCH_SIM_CUDA_LOG=1: one line per driver call): once at capture (the
// external start and end event records), and per replay (none on the application's thread: a
// replay is the application's cuGraphLaunch alone; the watchdog's event queries run per poll on
// its own thread, not per replay).
//   bench_graph_calls [--max-replay X]
// One rank; a single all-reduce captured (global capture mode) straight into the simulator's
// NCCL, then through libncclwatch.so (dlopen'ed RTLD_LOCAL, as bench_driver_calls does), each
// instantiated and replayed kReplays times with a stream synchronization after each. With
// --max-replay, exits 1 when the calls added per replay on the calling thread exceed X.
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

constexpr int kReplays = 200;

using AllReduceFn = ncclResult_t (*)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t,
                                     cudaStream_t);

CUgraphExec Capture(AllReduceFn all_reduce, ncclComm_t comm, CUstream s, CUdeviceptr buf) {
  CUgraph graph = nullptr;
  CUgraphExec exec = nullptr;
  cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL);
  all_reduce(reinterpret_cast<void*>(buf), reinterpret_cast<void*>(buf), 1, ncclFloat, ncclSum, comm,
             reinterpret_cast<cudaStream_t>(s));
  if (cuStreamEndCapture(s, &graph) != CUDA_SUCCESS || cuGraphInstantiate(&exec, graph, 0) != CUDA_SUCCESS)
    return nullptr;
  return exec;
}

void Replay(CUgraphExec exec, CUstream s) {
  for (int i = 0; i < kReplays; ++i) {
    cuGraphLaunch(exec, s);
    cuStreamSynchronize(s);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
}

}  // namespace

int main(int argc, char** argv) {
  double max_replay = -1;
  for (int i = 1; i + 1 < argc; i += 2)
    if (std::strcmp(argv[i], "--max-replay") == 0) max_replay = std::atof(argv[i + 1]);
  bench::DriverCallLog log;
  if (!log.Open("graph-calls")) return 2;

  cuInit(0);
  CUcontext ctx;
  cuDevicePrimaryCtxRetain(&ctx, 0);
  cuCtxSetCurrent(ctx);
  CUstream s;
  cuStreamCreate(&s, CU_STREAM_NON_BLOCKING);
  CUdeviceptr buf;
  cuMemAlloc(&buf, 64);
  void* lib = dlopen(NCCLWATCH_PRELOAD_PATH, RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    std::fprintf(log.out(), "bench_graph_calls: cannot load %s\n", NCCLWATCH_PRELOAD_PATH);
    return 2;
  }
  auto wrapped = reinterpret_cast<AllReduceFn>(dlsym(lib, "ncclAllReduce"));
  auto get_id = reinterpret_cast<ncclResult_t (*)(ncclUniqueId*)>(dlsym(lib, "ncclGetUniqueId"));
  auto init = reinterpret_cast<ncclResult_t (*)(ncclComm_t*, int, ncclUniqueId, int)>(dlsym(lib, "ncclCommInitRank"));
  ncclUniqueId id;
  ncclComm_t comm;
  if (!wrapped || !get_id || !init || get_id(&id) != ncclSuccess || init(&comm, 1, id, 0) != ncclSuccess) {
    std::fprintf(log.out(), "bench_graph_calls: simulator setup failed\n");
    return 2;
  }
  const long tid = ncclwatch::CurrentTid();
  // Warm-up: the marker pool and the stream's context (eager operations give their markers back).
  for (int i = 0; i < 8; ++i)
    wrapped(reinterpret_cast<void*>(buf), reinterpret_cast<void*>(buf), 1, ncclFloat, ncclSum, comm,
            reinterpret_cast<cudaStream_t>(s));
  cuStreamSynchronize(s);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  log.Drain(tid);

  CUgraphExec direct = Capture(&ncclAllReduce, comm, s, buf);
  auto capture_base = log.Drain(tid);
  CUgraphExec watched = Capture(wrapped, comm, s, buf);
  auto capture_with = log.Drain(tid);
  if (!direct || !watched) {
    std::printf("bench_graph_calls: a capture failed (the library broke it?)\n");
    return 1;
  }
  Replay(direct, s);
  auto replay_base = log.Drain(tid);
  Replay(watched, s);
  auto replay_with = log.Drain(tid);

  const bench::AddedCalls at_capture = bench::Added(capture_with, capture_base, 1);
  const bench::AddedCalls per_replay = bench::Added(replay_with, replay_base, kReplays);
  std::printf("driver calls added per captured operation at capture: %.2f on the calling thread (%s)\n",
              at_capture.mine, at_capture.detail.c_str());
  std::printf("driver calls added per replay: %.2f on the calling thread, %.2f on others (the watchdog's polls, "
              "%d replays of about 1 ms with a 10 ms poll) (%s)\n",
              per_replay.mine, per_replay.others, kReplays, per_replay.detail.c_str());
  bool over = false;
  if (max_replay >= 0 && per_replay.mine > max_replay) {
    std::printf("  above the bound of %.2f: a replay costs the application's thread driver calls\n", max_replay);
    over = true;
  }
  return over ? 1 : 0;
}
