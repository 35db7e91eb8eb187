/* A pipeline of stages (rank s is stage s) passing MICROBATCHES messages down with Send/Recv:
 * each stage first receives every microbatch from the stage before it, then sends them all to
 * the stage after it, so the first stage can finish its sends and leave while a later stage
 * still works (as the first stages of a pipeline-parallel job do at the end of a step).
 *   sim_pipeline [--microbatches K] [--stop-rank R --stop-at M [--stop-ms T]] [--quick-exit]
 * --stop-rank R --stop-at M: stage R stops for good (sleeps until killed) before receiving
 * microbatch M; with --stop-ms T, for T ms only, then goes on. --quick-exit: a stage that is done leaves through _exit(0) (no exit() handlers,
 * as a multiprocessing child does), else returns from main. Prints "ok" when done. */
#include <string.h>
#include <unistd.h>

#include "simutil.h"

int main(int argc, char** argv) {
  const int rank = simutil_env_int("RANK", 0), n = simutil_env_int("WORLD_SIZE", 1);
  int microbatches = 8, stop_rank = -1, stop_at = 0, stop_ms = -1, quick_exit = 0, i, m;
  const size_t count = 1024;
  ncclUniqueId id;
  ncclComm_t comm;
  CUstream stream;
  CUdeviceptr buf;

  for (i = 1; i < argc; ++i) {
    if (strcmp(argv[i], "--microbatches") == 0 && i + 1 < argc) microbatches = atoi(argv[++i]);
    else if (strcmp(argv[i], "--stop-rank") == 0 && i + 1 < argc) stop_rank = atoi(argv[++i]);
    else if (strcmp(argv[i], "--stop-at") == 0 && i + 1 < argc) stop_at = atoi(argv[++i]);
    else if (strcmp(argv[i], "--stop-ms") == 0 && i + 1 < argc) stop_ms = atoi(argv[++i]);
    else if (strcmp(argv[i], "--quick-exit") == 0) quick_exit = 1;
    else {
      fprintf(stderr, "usage: sim_pipeline [--microbatches K] [--stop-rank R --stop-at M [--stop-ms T]] [--quick-exit]\n");
      return SIMUTIL_EXIT_USAGE;
    }
  }
  simutil_cuda_init(simutil_env_int("LOCAL_RANK", 0));
  simutil_exchange_id("world", rank, &id);
  NCCLCHECK(ncclCommInitRank(&comm, n, id, rank));
  CUCHECK(cuStreamCreate(&stream, 0));
  buf = simutil_alloc(count * sizeof(float));
  if (rank > 0)
    for (m = 0; m < microbatches; ++m) {
      if (rank == stop_rank && m == stop_at) {
        if (stop_ms >= 0) simutil_sleep_ms(stop_ms);
        else
          for (;;) simutil_sleep_ms(1000);
      }
      NCCLCHECK(ncclRecv((void*)buf, count, ncclFloat32, rank - 1, comm, stream));
      CUCHECK(cuStreamSynchronize(stream));
    }
  if (rank + 1 < n)
    for (m = 0; m < microbatches; ++m) {
      NCCLCHECK(ncclSend((void*)buf, count, ncclFloat32, rank + 1, comm, stream));
      CUCHECK(cuStreamSynchronize(stream));
    }
  printf("ok\n");
  fflush(stdout);
  if (quick_exit) _exit(0);
  return 0;
}
