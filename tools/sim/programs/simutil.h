/* Helpers shared by the simulator's test programs (C11, NCCL + CUDA driver API only).
 * Header-only: every program is a single C file. */
#ifndef SIMUTIL_H
#define SIMUTIL_H

#include <cuda.h>
#include <errno.h>
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* Exit codes shared by the programs (docs/simulator.md). */
enum { SIMUTIL_EXIT_USAGE = 2, SIMUTIL_EXIT_API = 3, SIMUTIL_EXIT_WRONG = 4 };

#define NCCLCHECK(call)                                                                       \
  do {                                                                                        \
    ncclResult_t r_ = (call);                                                                 \
    if (r_ != ncclSuccess) {                                                                  \
      fprintf(stderr, "%s:%d: %s failed: %s (%d)\n", __FILE__, __LINE__, #call,               \
              ncclGetErrorString(r_), (int)r_);                                               \
      exit(SIMUTIL_EXIT_API);                                                                 \
    }                                                                                         \
  } while (0)

#define CUCHECK(call)                                                                         \
  do {                                                                                        \
    CUresult r_ = (call);                                                                     \
    if (r_ != CUDA_SUCCESS) {                                                                 \
      const char* s_ = "?";                                                                   \
      cuGetErrorString(r_, &s_);                                                              \
      fprintf(stderr, "%s:%d: %s failed: %s (%d)\n", __FILE__, __LINE__, #call, s_, (int)r_); \
      exit(SIMUTIL_EXIT_API);                                                                 \
    }                                                                                         \
  } while (0)

static inline int simutil_env_int(const char* name, int dflt) {
  const char* v = getenv(name);
  return v && *v ? atoi(v) : dflt;
}

static inline void simutil_sleep_ms(long ms) {
  struct timespec ts;
  ts.tv_sec = ms / 1000;
  ts.tv_nsec = (ms % 1000) * 1000000L;
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

static inline double simutil_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* Makes device LOCAL_RANK (modulo the device count) current on this thread. */
static inline CUcontext simutil_cuda_init(int local_rank) {
  int ndev = 0;
  CUdevice dev;
  CUcontext ctx;
  CUCHECK(cuInit(0));
  CUCHECK(cuDeviceGetCount(&ndev));
  CUCHECK(cuDeviceGet(&dev, ndev > 0 ? local_rank % ndev : 0));
  CUCHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
  CUCHECK(cuCtxSetCurrent(ctx));
  return ctx;
}

/* The unique id NAME travels as a file DIR/NAME.id: rank 0 creates it and publishes it
 * atomically (write a temporary file, rename), the others poll. */
static inline void simutil_exchange_id_in(const char* dir, const char* name, int rank, ncclUniqueId* id) {
  char path[4096], tmp[4200];
  snprintf(path, sizeof path, "%s/%s.id", dir, name);
  if (rank == 0) {
    FILE* f;
    NCCLCHECK(ncclGetUniqueId(id));
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
    f = fopen(tmp, "wb");
    if (!f || fwrite(id, sizeof *id, 1, f) != 1 || fclose(f) != 0 || rename(tmp, path) != 0) {
      fprintf(stderr, "cannot publish the unique id at %s: %s\n", path, strerror(errno));
      exit(SIMUTIL_EXIT_API);
    }
    return;
  }
  for (double start = simutil_now_ms();; simutil_sleep_ms(5)) {
    FILE* f = fopen(path, "rb");
    if (f) {
      size_t got = fread(id, sizeof *id, 1, f);
      fclose(f);
      if (got == 1) return;
    }
    if (simutil_now_ms() - start > 120e3) {
      fprintf(stderr, "rank %d: no unique id at %s after 120 s\n", rank, path);
      exit(SIMUTIL_EXIT_API);
    }
  }
}

/* The job's ids live in $NCCLWATCH_SIM_RUNDIR (simlaunch sets it). */
static inline void simutil_exchange_id(const char* name, int rank, ncclUniqueId* id) {
  const char* dir = getenv("NCCLWATCH_SIM_RUNDIR");
  if (!dir || !*dir) {
    fprintf(stderr, "NCCLWATCH_SIM_RUNDIR is not set: run under simlaunch\n");
    exit(SIMUTIL_EXIT_USAGE);
  }
  simutil_exchange_id_in(dir, name, rank, id);
}

/* Device buffers: the simulated driver's device memory, filled and read through copies. */
static inline CUdeviceptr simutil_alloc(size_t bytes) {
  CUdeviceptr p;
  CUCHECK(cuMemAlloc(&p, bytes ? bytes : 1));
  CUCHECK(cuMemsetD8(p, 0, bytes ? bytes : 1));
  return p;
}

/* `count` all-reduces of 1024 floats on a new stream, then waits for them. */
static inline void simutil_run_allreduces(ncclComm_t comm, int count) {
  CUstream stream;
  CUdeviceptr buf;
  int i;
  CUCHECK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
  buf = simutil_alloc(1024 * sizeof(float));
  for (i = 0; i < count; ++i) NCCLCHECK(ncclAllReduce((void*)buf, (void*)buf, 1024, ncclFloat32, ncclSum, comm, stream));
  CUCHECK(cuStreamSynchronize(stream));
}

#endif /* SIMUTIL_H */
