/* ncclCommSplit by parity (color = rank % 2, key = rank), then an all-reduce in each half:
 * each half sums only its own ranks. Exit 0 and "ok" when sizes, ranks and sums are right. */
#include "simutil.h"

int main(void) {
  const int rank = simutil_env_int("RANK", 0), n = simutil_env_int("WORLD_SIZE", 1);
  ncclUniqueId id;
  ncclComm_t world, half;
  CUstream stream;
  CUdeviceptr buf;
  int value = rank + 1, sum = 0, hrank = -1, hsize = -1, want_size = 0, want_sum = 0, r;

  simutil_cuda_init(simutil_env_int("LOCAL_RANK", 0));
  simutil_exchange_id("world", rank, &id);
  NCCLCHECK(ncclCommInitRank(&world, n, id, rank));
  NCCLCHECK(ncclCommSplit(world, rank % 2, rank, &half, NULL));
  NCCLCHECK(ncclCommCount(half, &hsize));
  NCCLCHECK(ncclCommUserRank(half, &hrank));
  for (r = rank % 2; r < n; r += 2) {
    ++want_size;
    want_sum += r + 1;
  }
  if (hsize != want_size || hrank != rank / 2) {
    fprintf(stderr, "rank %d: split gave rank %d of %d, want %d of %d\n", rank, hrank, hsize, rank / 2, want_size);
    return SIMUTIL_EXIT_WRONG;
  }

  CUCHECK(cuStreamCreate(&stream, 0));
  buf = simutil_alloc(sizeof(int));
  CUCHECK(cuMemcpyHtoD(buf, &value, sizeof value));
  NCCLCHECK(ncclAllReduce((void*)buf, (void*)buf, 1, ncclInt32, ncclSum, half, stream));
  CUCHECK(cuStreamSynchronize(stream));
  CUCHECK(cuMemcpyDtoH(&sum, buf, sizeof sum));
  NCCLCHECK(ncclCommDestroy(half));
  NCCLCHECK(ncclCommDestroy(world));
  if (sum != want_sum) {
    fprintf(stderr, "rank %d: sum %d, want %d\n", rank, sum, want_sum);
    return SIMUTIL_EXIT_WRONG;
  }
  printf("ok\n");
  return 0;
}
