/* A plain NCCL program, written only against nccl.h and the CUDA driver API (cuda.h): each
 * rank all-reduces a buffer 100 times; rank HANG_RANK (if set) stops calling NCCL at
 * iteration 50, so the others hang in an all-reduce. The unique id goes through a file
 * (NCCL_ID_FILE), the way a real launcher-less program passes it.
 *
 * On the GPU-free simulator (build/sim holds libnccl.so.2 and libcuda.so.1):
 *   NCCL_ID_FILE=/tmp/id HANG_RANK=1 ncclwatch run -- build/bin/simlaunch -n 4 -- build/bin/example_allreduce
 * On GPUs: build it against /usr/local/cuda/include, link -lnccl -lcuda, start one process per
 * GPU with RANK and WORLD_SIZE set (mpirun, srun), same command line otherwise.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cuda.h>
#include <nccl.h>

#define CHECK_CU(x)                                                     \
  do {                                                                  \
    CUresult r_ = (x);                                                  \
    if (r_ != CUDA_SUCCESS) {                                           \
      fprintf(stderr, "%s:%d: %s failed: %d\n", __FILE__, __LINE__, #x, (int)r_); \
      exit(3);                                                          \
    }                                                                   \
  } while (0)
#define CHECK_NCCL(x)                                                   \
  do {                                                                  \
    ncclResult_t r_ = (x);                                              \
    if (r_ != ncclSuccess) {                                            \
      fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #x, ncclGetErrorString(r_)); \
      exit(3);                                                          \
    }                                                                   \
  } while (0)

static int env_int(const char* name, int fallback) {
  const char* v = getenv(name);
  return v && *v ? atoi(v) : fallback;
}

/* Rank 0 writes the id to a temporary file and renames it into place; the others wait for it. */
static void exchange_id(ncclUniqueId* id, int rank) {
  const char* path = getenv("NCCL_ID_FILE");
  char fallback[512];
  if (!path) {
    const char* dir = getenv("NCCLWATCH_SIM_RUNDIR");  /* set by the simulator's launcher */
    snprintf(fallback, sizeof fallback, "%s/example-nccl-id", dir ? dir : "/tmp");
    path = fallback;
  }
  if (rank == 0) {
    char tmp[600];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    CHECK_NCCL(ncclGetUniqueId(id));
    FILE* f = fopen(tmp, "wb");
    if (!f || fwrite(id, sizeof *id, 1, f) != 1 || fclose(f) != 0 || rename(tmp, path) != 0) {
      perror(path);
      exit(2);
    }
    return;
  }
  for (int waited = 0; waited < 30000; waited += 10) {
    FILE* f = fopen(path, "rb");
    if (f) {
      size_t n = fread(id, sizeof *id, 1, f);
      fclose(f);
      if (n == 1) return;
    }
    usleep(10000);
  }
  fprintf(stderr, "rank %d: no unique id in %s after 30 s\n", rank, path);
  exit(2);
}

int main(void) {
  int rank = env_int("RANK", 0), nranks = env_int("WORLD_SIZE", 1);
  int hang_rank = env_int("HANG_RANK", -1), local = env_int("LOCAL_RANK", rank);
  const size_t count = 1 << 16;

  CUdevice dev;
  CUcontext ctx;
  CUstream stream;
  CUdeviceptr buf;
  CHECK_CU(cuInit(0));
  int ndev = 1;
  CHECK_CU(cuDeviceGetCount(&ndev));
  CHECK_CU(cuDeviceGet(&dev, local % ndev));
  CHECK_CU(cuDevicePrimaryCtxRetain(&ctx, dev));
  CHECK_CU(cuCtxSetCurrent(ctx));
  CHECK_CU(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
  CHECK_CU(cuMemAlloc(&buf, count * sizeof(float)));

  ncclUniqueId id;
  ncclComm_t comm;
  exchange_id(&id, rank);
  CHECK_NCCL(ncclCommInitRank(&comm, nranks, id, rank));

  float* host = malloc(count * sizeof(float));
  for (int iter = 0; iter < 100; ++iter) {
    if (iter == 50 && rank == hang_rank) {
      fprintf(stderr, "rank %d: busy elsewhere from iteration 50 on\n", rank);
      for (;;) pause();
    }
    for (size_t i = 0; i < count; ++i) host[i] = (float)(rank + 1);
    CHECK_CU(cuMemcpyHtoD(buf, host, count * sizeof(float)));
    CHECK_NCCL(ncclAllReduce((void*)buf, (void*)buf, count, ncclFloat, ncclSum, comm, (cudaStream_t)stream));
    CHECK_CU(cuStreamSynchronize(stream));
    CHECK_CU(cuMemcpyDtoH(host, buf, count * sizeof(float)));
    float expect = (float)nranks * (nranks + 1) / 2;
    if (host[0] != expect || host[count - 1] != expect) {
      fprintf(stderr, "rank %d: wrong sum %f, expected %f\n", rank, host[0], expect);
      return 4;
    }
  }
  CHECK_NCCL(ncclCommDestroy(comm));
  printf("rank %d: ok\n", rank);
  return 0;
}
