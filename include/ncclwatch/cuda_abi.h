/* ncclwatch: the subset of the CUDA driver API that ncclwatch and the GPU-free simulator
 * use, written as the project's own declarations (no CUDA toolkit needed to build).
 *
 * ncclwatch never links libcuda: lib/gpu loads these functions with dlopen("libcuda.so.1")
 * at run time, trying the versioned symbol names listed in NCCLWATCH_FOR_EACH_DRIVER_FN.
 * The simulator (tools/sim/cuda) implements and exports the whole list below, under both the
 * plain and the versioned names the real cuda.h maps them to.
 *
 * Skipped when a real cuda.h was included first (CUDA_VERSION defined). C and C++.
 */
#ifndef NCCLWATCH_CUDA_ABI_H
#define NCCLWATCH_CUDA_ABI_H

#include <stddef.h>
#include <stdint.h>

#ifndef CUDA_VERSION

#define CUDA_VERSION 12080
#define CUDAAPI

#ifndef NCCLWATCH_CUDA_STREAM_DEFINED
#define NCCLWATCH_CUDA_STREAM_DEFINED
typedef struct CUstream_st* cudaStream_t;
#endif

#ifdef __cplusplus
extern "C" {
#endif

typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef uint64_t cuuint64_t;
typedef struct CUctx_st* CUcontext;
typedef struct CUstream_st* CUstream;
typedef struct CUevent_st* CUevent;
typedef struct CUgraph_st* CUgraph;
typedef struct CUgraphExec_st* CUgraphExec;
typedef struct CUgraphNode_st* CUgraphNode;
typedef void (*CUhostFn)(void* userData);

#define CU_STREAM_LEGACY ((CUstream)0x1)
#define CU_STREAM_PER_THREAD ((CUstream)0x2)

typedef enum {
  CU_STREAM_DEFAULT = 0x0,
  CU_STREAM_NON_BLOCKING = 0x1
} CUstream_flags;

typedef enum {
  CU_EVENT_DEFAULT = 0x0,
  CU_EVENT_BLOCKING_SYNC = 0x1,
  CU_EVENT_DISABLE_TIMING = 0x2,
  CU_EVENT_INTERPROCESS = 0x4
} CUevent_flags;

/* cuEventRecordWithFlags (CUDA 11.1). EXTERNAL: during stream capture, the record becomes an
 * event record node that records the event again at each launch of the graph (host-queryable);
 * invalid outside of capture. A plain record during capture only orders streams within the
 * capture: the event is then "captured" (CUDA_ERROR_CAPTURED_EVENT) until recorded again. */
typedef enum {
  CU_EVENT_RECORD_DEFAULT = 0x0,
  CU_EVENT_RECORD_EXTERNAL = 0x1
} CUevent_record_flags;

typedef enum {
  CU_STREAM_CAPTURE_STATUS_NONE = 0,
  CU_STREAM_CAPTURE_STATUS_ACTIVE = 1,
  CU_STREAM_CAPTURE_STATUS_INVALIDATED = 2
} CUstreamCaptureStatus;

typedef enum {
  CU_STREAM_CAPTURE_MODE_GLOBAL = 0,
  CU_STREAM_CAPTURE_MODE_THREAD_LOCAL = 1,
  CU_STREAM_CAPTURE_MODE_RELAXED = 2
} CUstreamCaptureMode;

typedef enum {
  CUDA_SUCCESS = 0,
  CUDA_ERROR_INVALID_VALUE = 1,
  CUDA_ERROR_OUT_OF_MEMORY = 2,
  CUDA_ERROR_NOT_INITIALIZED = 3,
  CUDA_ERROR_DEINITIALIZED = 4,
  CUDA_ERROR_NO_DEVICE = 100,
  CUDA_ERROR_INVALID_DEVICE = 101,
  CUDA_ERROR_INVALID_CONTEXT = 201,
  CUDA_ERROR_INVALID_HANDLE = 400,
  CUDA_ERROR_ILLEGAL_STATE = 401,
  CUDA_ERROR_NOT_FOUND = 500,
  CUDA_ERROR_NOT_READY = 600,
  CUDA_ERROR_NOT_SUPPORTED = 801,
  CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED = 900,
  CUDA_ERROR_STREAM_CAPTURE_INVALIDATED = 901,
  CUDA_ERROR_STREAM_CAPTURE_UNMATCHED = 903,
  CUDA_ERROR_STREAM_CAPTURE_IMPLICIT = 906,
  CUDA_ERROR_CAPTURED_EVENT = 907,
  CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD = 908,
  CUDA_ERROR_UNKNOWN = 999
} CUresult;

/* Declarations with the names the real cuda.h (CUDA 12/13) maps the API to, so that a program
 * compiled against this header or the real one links to the same symbols. */
#define cuDevicePrimaryCtxRelease cuDevicePrimaryCtxRelease_v2
#define cuCtxPushCurrent cuCtxPushCurrent_v2
#define cuCtxPopCurrent cuCtxPopCurrent_v2
#define cuMemAlloc cuMemAlloc_v2
#define cuMemFree cuMemFree_v2
#define cuMemcpyHtoD cuMemcpyHtoD_v2
#define cuMemcpyDtoH cuMemcpyDtoH_v2
#define cuMemsetD8 cuMemsetD8_v2
#define cuStreamDestroy cuStreamDestroy_v2
#define cuStreamBeginCapture cuStreamBeginCapture_v2
#define cuEventDestroy cuEventDestroy_v2
#define cuEventElapsedTime cuEventElapsedTime_v2
#define cuGraphInstantiate cuGraphInstantiateWithFlags

CUresult cuInit(unsigned int flags);
CUresult cuDriverGetVersion(int* driverVersion);
CUresult cuDeviceGet(CUdevice* device, int ordinal);
CUresult cuDeviceGetCount(int* count);
CUresult cuDeviceGetName(char* name, int len, CUdevice dev);
CUresult cuDeviceGetPCIBusId(char* pciBusId, int len, CUdevice dev);
CUresult cuDevicePrimaryCtxRetain(CUcontext* pctx, CUdevice dev);
CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev);
CUresult cuCtxGetCurrent(CUcontext* pctx);
CUresult cuCtxSetCurrent(CUcontext ctx);
CUresult cuCtxGetDevice(CUdevice* device);
CUresult cuCtxPushCurrent_v2(CUcontext ctx);
CUresult cuCtxPopCurrent_v2(CUcontext* pctx);
CUresult cuMemAlloc_v2(CUdeviceptr* dptr, size_t bytesize);
CUresult cuMemFree_v2(CUdeviceptr dptr);
CUresult cuMemcpyHtoD_v2(CUdeviceptr dstDevice, const void* srcHost, size_t ByteCount);
CUresult cuMemcpyDtoH_v2(void* dstHost, CUdeviceptr srcDevice, size_t ByteCount);
CUresult cuMemsetD8_v2(CUdeviceptr dstDevice, unsigned char uc, size_t N);
CUresult cuStreamCreate(CUstream* phStream, unsigned int Flags);
CUresult cuStreamDestroy_v2(CUstream hStream);
CUresult cuStreamSynchronize(CUstream hStream);
CUresult cuStreamQuery(CUstream hStream);
CUresult cuStreamGetCtx(CUstream hStream, CUcontext* pctx);
CUresult cuStreamIsCapturing(CUstream hStream, CUstreamCaptureStatus* captureStatus);
CUresult cuStreamGetCaptureInfo_v2(CUstream hStream, CUstreamCaptureStatus* captureStatus_out,
                                   cuuint64_t* id_out, CUgraph* graph_out,
                                   const CUgraphNode** dependencies_out,
                                   size_t* numDependencies_out);
CUresult cuStreamBeginCapture_v2(CUstream hStream, CUstreamCaptureMode mode);
CUresult cuStreamEndCapture(CUstream hStream, CUgraph* phGraph);
CUresult cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode* mode);
CUresult cuGraphInstantiateWithFlags(CUgraphExec* phGraphExec, CUgraph hGraph,
                                     unsigned long long flags);
CUresult cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream);
CUresult cuGraphExecDestroy(CUgraphExec hGraphExec);
CUresult cuGraphDestroy(CUgraph hGraph);
CUresult cuEventCreate(CUevent* phEvent, unsigned int Flags);
CUresult cuEventRecord(CUevent hEvent, CUstream hStream);
CUresult cuEventRecordWithFlags(CUevent hEvent, CUstream hStream, unsigned int flags);
CUresult cuEventQuery(CUevent hEvent);
CUresult cuEventSynchronize(CUevent hEvent);
CUresult cuEventElapsedTime_v2(float* pMilliseconds, CUevent hStart, CUevent hEnd);
CUresult cuEventDestroy_v2(CUevent hEvent);
CUresult cuLaunchHostFunc(CUstream hStream, CUhostFn fn, void* userData);
CUresult cuGetErrorString(CUresult error, const char** pStr);
CUresult cuGetErrorName(CUresult error, const char** pStr);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* !CUDA_VERSION */

/* The driver functions libncclwatch loads at run time. X(field, type_params, sym1, sym2):
 * the first symbol found wins, so newer versioned names come first and every driver since
 * CUDA 11 resolves each entry. */
#define NCCLWATCH_FOR_EACH_DRIVER_FN(X)                                                      \
  X(Init, (unsigned int), "cuInit", "cuInit")                                                \
  X(DriverGetVersion, (int*), "cuDriverGetVersion", "cuDriverGetVersion")                    \
  X(CtxGetCurrent, (CUcontext*), "cuCtxGetCurrent", "cuCtxGetCurrent")                       \
  X(CtxPushCurrent, (CUcontext), "cuCtxPushCurrent_v2", "cuCtxPushCurrent")                  \
  X(CtxPopCurrent, (CUcontext*), "cuCtxPopCurrent_v2", "cuCtxPopCurrent")                    \
  X(StreamGetCtx, (CUstream, CUcontext*), "cuStreamGetCtx", "cuStreamGetCtx")                \
  X(StreamIsCapturing, (CUstream, CUstreamCaptureStatus*), "cuStreamIsCapturing",            \
    "cuStreamIsCapturing")                                                                   \
  X(ThreadExchangeStreamCaptureMode, (CUstreamCaptureMode*),                                 \
    "cuThreadExchangeStreamCaptureMode", "cuThreadExchangeStreamCaptureMode")                \
  X(EventCreate, (CUevent*, unsigned int), "cuEventCreate", "cuEventCreate")                 \
  X(EventRecord, (CUevent, CUstream), "cuEventRecord", "cuEventRecord")                      \
  X(EventQuery, (CUevent), "cuEventQuery", "cuEventQuery")                                   \
  X(EventElapsedTime, (float*, CUevent, CUevent), "cuEventElapsedTime_v2",                   \
    "cuEventElapsedTime")                                                                    \
  X(EventDestroy, (CUevent), "cuEventDestroy_v2", "cuEventDestroy")                          \
  X(GetErrorString, (CUresult, const char**), "cuGetErrorString", "cuGetErrorString")

/* Optional: loaded when present (a driver without one works as before). CUDA 11.1+. */
#define NCCLWATCH_FOR_EACH_OPTIONAL_DRIVER_FN(X)                                             \
  X(EventRecordWithFlags, (CUevent, CUstream, unsigned int), "cuEventRecordWithFlags",       \
    "cuEventRecordWithFlags")

#endif /* NCCLWATCH_CUDA_ABI_H */
