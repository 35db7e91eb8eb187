/* A ring of Send/Recv inside a group (each rank sends to rank+1 and receives from rank-1),
 * three rounds, with a message larger than one simulator pipe. Exit 0 and "ok" when every
 * rank received its left neighbour's data. */
#include "simutil.h"

int main(void) {
  const int rank = simutil_env_int("RANK", 0), n = simutil_env_int("WORLD_SIZE", 1);
  const int next = (rank + 1) % n, prev = (rank + n - 1) % n;
  const size_t count = 100000; /* 400 KB: more than a 256 KiB pipe */
  ncclUniqueId id;
  ncclComm_t comm;
  CUstream stream;
  float* host = malloc(count * sizeof *host);
  CUdeviceptr send, recv;
  size_t i, bad = 0;
  int round;

  simutil_cuda_init(simutil_env_int("LOCAL_RANK", 0));
  simutil_exchange_id("world", rank, &id);
  NCCLCHECK(ncclCommInitRank(&comm, n, id, rank));
  CUCHECK(cuStreamCreate(&stream, 0));
  send = simutil_alloc(count * sizeof(float));
  recv = simutil_alloc(count * sizeof(float));

  for (round = 0; round < 3; ++round) {
    for (i = 0; i < count; ++i) host[i] = (float)(rank * 1000 + round * 100) + (float)(i % 50);
    CUCHECK(cuMemcpyHtoD(send, host, count * sizeof(float)));
    NCCLCHECK(ncclGroupStart());
    NCCLCHECK(ncclSend((void*)send, count, ncclFloat32, next, comm, stream));
    NCCLCHECK(ncclRecv((void*)recv, count, ncclFloat32, prev, comm, stream));
    NCCLCHECK(ncclGroupEnd());
    CUCHECK(cuStreamSynchronize(stream));
    CUCHECK(cuMemcpyDtoH(host, recv, count * sizeof(float)));
    for (i = 0; i < count; ++i) {
      float want = (float)(prev * 1000 + round * 100) + (float)(i % 50);
      if (host[i] != want && bad++ < 5)
        fprintf(stderr, "rank %d round %d: element %zu is %g, want %g\n", rank, round, i, host[i], want);
    }
  }
  NCCLCHECK(ncclCommDestroy(comm));
  if (bad) return SIMUTIL_EXIT_WRONG;
  printf("ok\n");
  return 0;
}
