/* Collectives captured into CUDA graphs and replayed (issue 47: a hang inside a replay).
 *   sim_graphs --mode healthy|stop|kernel|order [--replays N] [--at K] [--rank R] [--count C]
 * Each rank captures its step once (stream capture, --capture-mode global|thread_local|relaxed)
 * and replays it N times (default 20), synchronizing its stream after each replay:
 *   healthy  one graph: the application's "kernel" (a host node) then an all-reduce
 *   stop     as healthy; rank R stops replaying before replay K (busy in host code:
 *            write_checkpoint() never returns), the others wait inside replay K
 *   kernel   as healthy; at replay K rank R's captured kernel never ends (the GPU never
 *            reaches the all-reduce after it)
 *   order    two graphs, A (all-reduce of C floats) and B (all-reduce of 2C); each replay step
 *            launches A then B, except rank R from step K on, which launches B then A
 * Prints "ok" when every replay completed. */
#include <string.h>
#include <unistd.h>

#include "simutil.h"

struct Kernel {
  int rank, hang_rank, hang_at, runs;
};

/* The application's own kernel, captured as a host node: runs at every replay. */
static void app_kernel(void* arg) {
  struct Kernel* k = (struct Kernel*)arg;
  ++k->runs;
  if (k->rank == k->hang_rank && k->runs == k->hang_at)
    for (;;) simutil_sleep_ms(1000); /* a kernel that never ends */
  simutil_sleep_ms(1);
}

/* Busy in host code: a checkpoint write that never ends. */
__attribute__((noinline)) static void write_checkpoint(void) {
  volatile unsigned long spin = 0;
  for (;;) {
    ++spin;
    if ((spin & 0xfffff) == 0) simutil_sleep_ms(1);
  }
}

static CUgraphExec capture(CUstream s, CUstreamCaptureMode mode, ncclComm_t comm, CUdeviceptr buf, size_t count,
                           struct Kernel* kernel) {
  CUgraph graph;
  CUgraphExec exec;
  CUCHECK(cuStreamBeginCapture(s, mode));
  if (kernel) CUCHECK(cuLaunchHostFunc(s, app_kernel, kernel));
  NCCLCHECK(ncclAllReduce((void*)buf, (void*)buf, count, ncclFloat32, ncclSum, comm, (cudaStream_t)s));
  CUCHECK(cuStreamEndCapture(s, &graph));
  CUCHECK(cuGraphInstantiate(&exec, graph, 0));
  return exec;
}

int main(int argc, char** argv) {
  const int rank = simutil_env_int("RANK", 0), n = simutil_env_int("WORLD_SIZE", 1);
  const char* mode = "healthy";
  int replays = 20, at = -1, who = -1, i;
  size_t count = 1024;
  CUstreamCaptureMode capture_mode = CU_STREAM_CAPTURE_MODE_GLOBAL;
  ncclUniqueId id;
  ncclComm_t comm;
  CUstream stream;
  CUdeviceptr a, b;
  CUgraphExec ga, gb = NULL;
  struct Kernel kernel;

  for (i = 1; i < argc; ++i) {
    if (strcmp(argv[i], "--mode") == 0 && i + 1 < argc) mode = argv[++i];
    else if (strcmp(argv[i], "--replays") == 0 && i + 1 < argc) replays = atoi(argv[++i]);
    else if (strcmp(argv[i], "--at") == 0 && i + 1 < argc) at = atoi(argv[++i]);
    else if (strcmp(argv[i], "--rank") == 0 && i + 1 < argc) who = atoi(argv[++i]);
    else if (strcmp(argv[i], "--count") == 0 && i + 1 < argc) count = (size_t)atoi(argv[++i]);
    else if (strcmp(argv[i], "--capture-mode") == 0 && i + 1 < argc) {
      ++i;
      capture_mode = strcmp(argv[i], "relaxed") == 0        ? CU_STREAM_CAPTURE_MODE_RELAXED
                     : strcmp(argv[i], "thread_local") == 0 ? CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
                                                            : CU_STREAM_CAPTURE_MODE_GLOBAL;
    } else {
      fputs("usage: sim_graphs --mode healthy|stop|kernel|order [--replays N] [--at K] [--rank R] [--count C]\n"
            "       [--capture-mode global|thread_local|relaxed]\n",
            stderr);
      return SIMUTIL_EXIT_USAGE;
    }
  }
  simutil_cuda_init(simutil_env_int("LOCAL_RANK", 0));
  simutil_exchange_id("world", rank, &id);
  NCCLCHECK(ncclCommInitRank(&comm, n, id, rank));
  CUCHECK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
  a = simutil_alloc(2 * count * sizeof(float));
  b = simutil_alloc(2 * count * sizeof(float));
  kernel.rank = rank;
  kernel.hang_rank = strcmp(mode, "kernel") == 0 ? who : -1;
  kernel.hang_at = at;
  kernel.runs = 0;

  ga = capture(stream, capture_mode, comm, a, count, &kernel);
  if (strcmp(mode, "order") == 0) gb = capture(stream, capture_mode, comm, b, 2 * count, NULL);
  for (i = 1; i <= replays; ++i) {
    if (strcmp(mode, "stop") == 0 && rank == who && i == at) write_checkpoint();
    if (gb && rank == who && i >= at) {
      CUCHECK(cuGraphLaunch(gb, stream));
      CUCHECK(cuGraphLaunch(ga, stream));
    } else {
      CUCHECK(cuGraphLaunch(ga, stream));
      if (gb) CUCHECK(cuGraphLaunch(gb, stream));
    }
    CUCHECK(cuStreamSynchronize(stream));
    simutil_sleep_ms(20);
  }
  NCCLCHECK(ncclCommDestroy(comm));
  printf("ok\n");
  return 0;
}
