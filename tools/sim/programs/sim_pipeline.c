/* A pipeline of stages (rank s is stage s) passing MICROBATCHES messages down with Send/Recv:
 * each stage first receives every microbatch from the stage before it, then sends them all to
 * the stage after it, so the first stage can finish its sends and leave while a later stage
 * still works (as the first stages of a pipeline-parallel job do at the end of a step).
 *   sim_pipeline [--microbatches K] [--stop-rank R --stop-at M [--stop-ms T]] [--quick-exit]
 * --stop-rank R --stop-at M: stage R stops for good (sleeps until killed) before receiving
 * microbatch M; with --stop-ms T, for T ms only, then goes on. --quick-exit: a stage that is done leaves through _exit(0) (no exit() handlers,
 * as a multiprocessing child does), else returns from main. --skip: stage 0 also sends each
 * microbatch straight to the last stage (a skip connection), in one group with its send to stage
 * 1; the last stage receives both in one group; the middle stages pass each microbatch on as it
 * comes. With --microbatches M+1 --stop-at M, stage 0 sends its last and leaves while the last
 * stage waits in a group that holds a receive from it. Prints "ok" when done. */
#include <string.h>
#include <unistd.h>

#include "simutil.h"

int main(int argc, char** argv) {
  const int rank = simutil_env_int("RANK", 0), n = simutil_env_int("WORLD_SIZE", 1);
  int microbatches = 8, stop_rank = -1, stop_at = 0, stop_ms = -1, quick_exit = 0, skip = 0, i, m;
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
    else if (strcmp(argv[i], "--skip") == 0) skip = 1;
    else {
      fprintf(stderr, "usage: sim_pipeline [--microbatches K] [--stop-rank R --stop-at M [--stop-ms T]] [--quick-exit] [--skip]\n");
      return SIMUTIL_EXIT_USAGE;
    }
  }
  simutil_cuda_init(simutil_env_int("LOCAL_RANK", 0));
  simutil_exchange_id("world", rank, &id);
  NCCLCHECK(ncclCommInitRank(&comm, n, id, rank));
  CUCHECK(cuStreamCreate(&stream, 0));
  buf = simutil_alloc(2 * count * sizeof(float));
  if (skip && n >= 3) {
    for (m = 0; m < microbatches; ++m) {
      if (rank == stop_rank && m == stop_at)
        for (;;) simutil_sleep_ms(1000);
      NCCLCHECK(ncclGroupStart());
      if (rank == 0) {
        NCCLCHECK(ncclSend((void*)buf, count, ncclFloat32, 1, comm, stream));
        NCCLCHECK(ncclSend((void*)buf, count, ncclFloat32, n - 1, comm, stream));
      } else if (rank == n - 1) {
        NCCLCHECK(ncclRecv((void*)buf, count, ncclFloat32, rank - 1, comm, stream));
        NCCLCHECK(ncclRecv((void*)(buf + count * sizeof(float)), count, ncclFloat32, 0, comm, stream));
      } else {
        NCCLCHECK(ncclRecv((void*)buf, count, ncclFloat32, rank - 1, comm, stream));
      }
      NCCLCHECK(ncclGroupEnd());
      CUCHECK(cuStreamSynchronize(stream));
      if (rank > 0 && rank < n - 1) {
        NCCLCHECK(ncclSend((void*)buf, count, ncclFloat32, rank + 1, comm, stream));
        CUCHECK(cuStreamSynchronize(stream));
      }
    }
    microbatches = 0;  /* done: skip the plain pipeline below */
  }
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
