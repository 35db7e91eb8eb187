/* Built against the real cuda.h when present: checks that a program using the toolkit's
 * names and signatures links to and runs on the simulated driver. */
#include <cuda.h>
#include <stdio.h>
#include <string.h>

static int failures = 0;

#define CHECK(call, expected)                                                        \
  do {                                                                               \
    CUresult r_ = (call);                                                            \
    if (r_ != (expected)) {                                                          \
      fprintf(stderr, "%s:%d: %s returned %d, expected %d\n", __FILE__, __LINE__, #call, \
              (int)r_, (int)(expected));                                             \
      ++failures;                                                                    \
    }                                                                                \
  } while (0)

static void markDone(void* flag) { *(int*)flag = 1; }

int main(void) {
  CUdevice dev;
  CUcontext ctx, current = NULL;
  CUdeviceptr dptr = 0;
  CUstream stream;
  CUevent event;
  int ran = 0, version = 0;
  const char in[] = "simulated", *name = NULL;
  char out[sizeof in] = {0};

  CHECK(cuInit(0), CUDA_SUCCESS);
  CHECK(cuDriverGetVersion(&version), CUDA_SUCCESS);
  CHECK(cuDeviceGet(&dev, 0), CUDA_SUCCESS);
  CHECK(cuDevicePrimaryCtxRetain(&ctx, dev), CUDA_SUCCESS);
  CHECK(cuCtxSetCurrent(ctx), CUDA_SUCCESS);
  CHECK(cuCtxGetCurrent(&current), CUDA_SUCCESS);
  CHECK(cuMemAlloc(&dptr, sizeof in), CUDA_SUCCESS);
  CHECK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  CHECK(cuEventCreate(&event, CU_EVENT_DEFAULT), CUDA_SUCCESS);
  CHECK(cuLaunchHostFunc(stream, markDone, &ran), CUDA_SUCCESS);
  CHECK(cuEventRecord(event, stream), CUDA_SUCCESS);
  CHECK(cuStreamSynchronize(stream), CUDA_SUCCESS);
  CHECK(cuEventQuery(event), CUDA_SUCCESS);
  CHECK(cuMemcpyHtoD(dptr, in, sizeof in), CUDA_SUCCESS);
  CHECK(cuMemcpyDtoH(out, dptr, sizeof in), CUDA_SUCCESS);
  CHECK(cuGetErrorName(CUDA_ERROR_NOT_READY, &name), CUDA_SUCCESS);
  CHECK(cuEventDestroy(event), CUDA_SUCCESS);
  CHECK(cuStreamDestroy(stream), CUDA_SUCCESS);
  CHECK(cuMemFree(dptr), CUDA_SUCCESS);
  CHECK(cuDevicePrimaryCtxRelease(dev), CUDA_SUCCESS);

  if (version != 12080 || current != ctx || !ran || memcmp(in, out, sizeof in) != 0 || !name ||
      strcmp(name, "CUDA_ERROR_NOT_READY") != 0) {
    fprintf(stderr, "wrong results: version=%d ran=%d out=%s name=%s\n", version, ran, out,
            name ? name : "(null)");
    ++failures;
  }
  if (failures) return 1;
  printf("sim_cuda C program: OK\n");
  return 0;
}
