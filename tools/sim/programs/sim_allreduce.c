/* All-reduce (sum) over every rank, float32 out of place and int32 in place, with a size
 * that needs several chunks through the simulator's staging area. Exit 0 and "ok" when every
 * element is right. */
#include "simutil.h"

int main(void) {
  const int rank = simutil_env_int("RANK", 0), n = simutil_env_int("WORLD_SIZE", 1);
  const size_t count = (1u << 18) + 3; /* 1 MiB of floats: several 512 KiB chunks at 8 ranks */
  ncclUniqueId id;
  ncclComm_t comm;
  CUstream stream;
  float* hf = malloc(count * sizeof *hf);
  int* hi = malloc(count * sizeof *hi);
  CUdeviceptr fsend, frecv, ibuf;
  size_t i, bad = 0;

  simutil_cuda_init(simutil_env_int("LOCAL_RANK", 0));
  simutil_exchange_id("world", rank, &id);
  NCCLCHECK(ncclCommInitRank(&comm, n, id, rank));
  CUCHECK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));

  fsend = simutil_alloc(count * sizeof(float));
  frecv = simutil_alloc(count * sizeof(float));
  ibuf = simutil_alloc(count * sizeof(int));
  for (i = 0; i < count; ++i) {
    hf[i] = (float)(rank + 1) + (float)(i % 7);
    hi[i] = rank * 1000 + (int)(i % 100000);
  }
  CUCHECK(cuMemcpyHtoD(fsend, hf, count * sizeof(float)));
  CUCHECK(cuMemcpyHtoD(ibuf, hi, count * sizeof(int)));

  NCCLCHECK(ncclAllReduce((void*)fsend, (void*)frecv, count, ncclFloat32, ncclSum, comm, stream));
  NCCLCHECK(ncclAllReduce((void*)ibuf, (void*)ibuf, count, ncclInt32, ncclSum, comm, stream));
  CUCHECK(cuStreamSynchronize(stream));

  CUCHECK(cuMemcpyDtoH(hf, frecv, count * sizeof(float)));
  CUCHECK(cuMemcpyDtoH(hi, ibuf, count * sizeof(int)));
  for (i = 0; i < count; ++i) {
    float want_f = (float)(n * (n + 1) / 2) + (float)n * (float)(i % 7);
    int want_i = 1000 * n * (n - 1) / 2 + n * (int)(i % 100000);
    if (hf[i] != want_f || hi[i] != want_i) {
      if (bad++ < 5)
        fprintf(stderr, "rank %d: element %zu: float %g (want %g), int %d (want %d)\n", rank, i, hf[i],
                want_f, hi[i], want_i);
    }
  }
  NCCLCHECK(ncclCommDestroy(comm));
  if (bad) {
    fprintf(stderr, "rank %d: %zu wrong elements\n", rank, bad);
    return SIMUTIL_EXIT_WRONG;
  }
  printf("ok\n");
  return 0;
}
