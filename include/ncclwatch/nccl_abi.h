/* ncclwatch: the public NCCL ABI that ncclwatch wraps, written as the project's own
 * declarations so that nothing here needs the CUDA toolkit or nccl.h to build.
 *
 * Two parts:
 *  1. Types and constants of NCCL 2.28's public API. Skipped when a real nccl.h was included
 *     first (NCCL_H_ defined): then the real types are used, which is how
 *     tests/abi/test_nccl_abi.cpp verifies every signature below against the real header.
 *  2. X-macro lists of every wrapped function. One list drives the wrappers in
 *     lib/intercept, the op-name table, the real-symbol table and the ABI tests.
 *
 * This file is C and C++ compatible (the simulator and the C example use part 1).
 */
#ifndef NCCLWATCH_NCCL_ABI_H
#define NCCLWATCH_NCCL_ABI_H

#include <stddef.h>
#include <stdint.h>
#include <limits.h>

#ifndef NCCL_H_

#ifndef NCCLWATCH_CUDA_STREAM_DEFINED
#define NCCLWATCH_CUDA_STREAM_DEFINED
/* Same underlying type as the CUDA runtime's cudaStream_t and the driver's CUstream. */
typedef struct CUstream_st* cudaStream_t;
#endif

#define NCCL_MAJOR 2
#define NCCL_MINOR 28
#define NCCL_PATCH 0
#define NCCL_SUFFIX ""
#define NCCL_VERSION_CODE 22800
#define NCCL_VERSION(X, Y, Z) \
  (((X) <= 2 && (Y) <= 8) ? (X) * 1000 + (Y) * 100 + (Z) : (X) * 10000 + (Y) * 100 + (Z))

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ncclComm* ncclComm_t;
typedef struct ncclWindow_vidmem* ncclWindow_t;
#define NCCL_COMM_NULL NULL

#define NCCL_UNIQUE_ID_BYTES 128
typedef struct {
  char internal[NCCL_UNIQUE_ID_BYTES];
} ncclUniqueId;

typedef enum {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6,
  ncclInProgress = 7,
  ncclNumResults = 8
} ncclResult_t;

#define NCCL_CONFIG_UNDEF_INT INT_MIN
#define NCCL_CONFIG_UNDEF_PTR NULL
#define NCCL_SPLIT_NOCOLOR -1
#define NCCL_UNDEF_FLOAT -1.0f
#define NCCL_SHRINK_DEFAULT 0x00
#define NCCL_SHRINK_ABORT 0x01
#define NCCL_REVOKE_DEFAULT 0x00

/* ncclConfig_t as of 2.28. Older NCCL versions have a prefix of these fields; readers must
 * check `size` before touching a field (see lib/record/comm_registry.cpp). */
typedef struct ncclConfig_v22800 {
  size_t size;
  unsigned int magic;
  unsigned int version;
  int blocking;
  int cgaClusterSize;
  int minCTAs;
  int maxCTAs;
  const char* netName;
  int splitShare;
  int trafficClass;
  const char* commName;
  int collnetEnable;
  int CTAPolicy;
  int shrinkShare;
  int nvlsCTAs;
  int nChannelsPerNetPeer;
  int nvlinkCentricSched;
} ncclConfig_t;

#define NCCL_CONFIG_INITIALIZER                                                              \
  {                                                                                          \
    sizeof(ncclConfig_t), 0xcafebeef, NCCL_VERSION(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH),      \
        NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT,                 \
        NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_PTR, NCCL_CONFIG_UNDEF_INT,                 \
        NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_PTR, NCCL_CONFIG_UNDEF_INT,                 \
        NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT,                 \
        NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT                                         \
  }

typedef struct ncclSimInfo_v22200 {
  size_t size;
  unsigned int magic;
  unsigned int version;
  float estimatedTime;
} ncclSimInfo_t;

#define NCCL_SIM_INFO_INITIALIZER \
  { sizeof(ncclSimInfo_t), 0x74685283, NCCL_VERSION(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH), NCCL_UNDEF_FLOAT }

typedef enum { ncclNumOps_dummy = 5 } ncclRedOp_dummy_t;
typedef enum {
  ncclSum = 0,
  ncclProd = 1,
  ncclMax = 2,
  ncclMin = 3,
  ncclAvg = 4,
  ncclNumOps = 5,
  ncclMaxRedOp = 0x7fffffff
} ncclRedOp_t;

typedef enum {
  ncclInt8 = 0, ncclChar = 0,
  ncclUint8 = 1,
  ncclInt32 = 2, ncclInt = 2,
  ncclUint32 = 3,
  ncclInt64 = 4,
  ncclUint64 = 5,
  ncclFloat16 = 6, ncclHalf = 6,
  ncclFloat32 = 7, ncclFloat = 7,
  ncclFloat64 = 8, ncclDouble = 8,
  ncclBfloat16 = 9,
  ncclFloat8e4m3 = 10,
  ncclFloat8e5m2 = 11,
  ncclNumTypes = 12
} ncclDataType_t;

typedef enum { ncclScalarDevice = 0, ncclScalarHostImmediate = 1 } ncclScalarResidence_t;

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* !NCCL_H_ */

/* Layout facts both our types (here) and the real nccl.h (tests/abi) are checked against. */
#define NCCLWATCH_ABI_CONFIG_SIZE_2_28 80
#define NCCLWATCH_ABI_CONFIG_COMMNAME_OFFSET 48
#define NCCLWATCH_ABI_UNIQUE_ID_SIZE 128

/* ---------------------------------------------------------------------------------------
 * X-macro lists. Each entry: X(ret, name, params, args, ...).
 * ------------------------------------------------------------------------------------- */

/* Operations that move data: recorded in the flight record and followed on the GPU.
 * X(name, kind, params, args, count_expr, dtype_expr, redop_expr, root_or_peer_expr)
 * kind is an ncclwatch op kind (include/ncclwatch/trace_format.h); redop/root are -1 when
 * the operation has none. `count` is NCCL's own count argument. */
#define NCCLWATCH_FOR_EACH_OPERATION(X)                                                          \
  X(ncclAllReduce, AllReduce,                                                                     \
    (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op, \
     ncclComm_t comm, cudaStream_t stream),                                                       \
    (sendbuff, recvbuff, count, datatype, op, comm, stream), count, datatype, (int)op, -1)        \
  X(ncclBroadcast, Broadcast,                                                                     \
    (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,       \
     ncclComm_t comm, cudaStream_t stream),                                                       \
    (sendbuff, recvbuff, count, datatype, root, comm, stream), count, datatype, -1, root)         \
  X(ncclBcast, Broadcast,                                                                         \
    (void* buff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm,                \
     cudaStream_t stream),                                                                        \
    (buff, count, datatype, root, comm, stream), count, datatype, -1, root)                       \
  X(ncclReduce, Reduce,                                                                           \
    (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op, \
     int root, ncclComm_t comm, cudaStream_t stream),                                             \
    (sendbuff, recvbuff, count, datatype, op, root, comm, stream), count, datatype, (int)op, root) \
  X(ncclAllGather, AllGather,                                                                     \
    (const void* sendbuff, void* recvbuff, size_t sendcount, ncclDataType_t datatype,             \
     ncclComm_t comm, cudaStream_t stream),                                                       \
    (sendbuff, recvbuff, sendcount, datatype, comm, stream), sendcount, datatype, -1, -1)         \
  X(ncclReduceScatter, ReduceScatter,                                                             \
    (const void* sendbuff, void* recvbuff, size_t recvcount, ncclDataType_t datatype,             \
     ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream),                                       \
    (sendbuff, recvbuff, recvcount, datatype, op, comm, stream), recvcount, datatype, (int)op, -1) \
  X(ncclAlltoAll, AlltoAll,                                                                       \
    (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,                 \
     ncclComm_t comm, cudaStream_t stream),                                                       \
    (sendbuff, recvbuff, count, datatype, comm, stream), count, datatype, -1, -1)                 \
  X(ncclGather, Gather,                                                                           \
    (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,       \
     ncclComm_t comm, cudaStream_t stream),                                                       \
    (sendbuff, recvbuff, count, datatype, root, comm, stream), count, datatype, -1, root)         \
  X(ncclScatter, Scatter,                                                                         \
    (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,       \
     ncclComm_t comm, cudaStream_t stream),                                                       \
    (sendbuff, recvbuff, count, datatype, root, comm, stream), count, datatype, -1, root)         \
  X(ncclSend, Send,                                                                               \
    (const void* sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,      \
     cudaStream_t stream),                                                                        \
    (sendbuff, count, datatype, peer, comm, stream), count, datatype, -1, peer)                   \
  X(ncclRecv, Recv,                                                                               \
    (void* recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,            \
     cudaStream_t stream),                                                                        \
    (recvbuff, count, datatype, peer, comm, stream), count, datatype, -1, peer)

/* Functions with ncclwatch logic of their own (groups, communicator life cycle, errors).
 * X(ret, name, params, args). Wrappers are written by hand in lib/intercept/lifecycle.cpp;
 * this list still drives their declarations, real-symbol lookup and the ABI check. */
#define NCCLWATCH_FOR_EACH_MANAGED(X)                                                            \
  X(ncclResult_t, ncclGroupStart, (void), ())                                                     \
  X(ncclResult_t, ncclGroupEnd, (void), ())                                                       \
  X(ncclResult_t, ncclGroupSimulateEnd, (ncclSimInfo_t * simInfo), (simInfo))                    \
  X(ncclResult_t, ncclGetUniqueId, (ncclUniqueId * uniqueId), (uniqueId))                         \
  X(ncclResult_t, ncclCommInitRank, (ncclComm_t * comm, int nranks, ncclUniqueId commId, int rank), \
    (comm, nranks, commId, rank))                                                                 \
  X(ncclResult_t, ncclCommInitRankConfig,                                                         \
    (ncclComm_t * comm, int nranks, ncclUniqueId commId, int rank, ncclConfig_t* config),         \
    (comm, nranks, commId, rank, config))                                                         \
  X(ncclResult_t, ncclCommInitAll, (ncclComm_t * comm, int ndev, const int* devlist),             \
    (comm, ndev, devlist))                                                                        \
  X(ncclResult_t, ncclCommInitRankScalable,                                                       \
    (ncclComm_t * newcomm, int nranks, int myrank, int nId, ncclUniqueId* commIds,                \
     ncclConfig_t* config),                                                                       \
    (newcomm, nranks, myrank, nId, commIds, config))                                              \
  X(ncclResult_t, ncclCommSplit,                                                                  \
    (ncclComm_t comm, int color, int key, ncclComm_t* newcomm, ncclConfig_t* config),             \
    (comm, color, key, newcomm, config))                                                          \
  X(ncclResult_t, ncclCommShrink,                                                                 \
    (ncclComm_t comm, int* excludeRanksList, int excludeRanksCount, ncclComm_t* newcomm,          \
     ncclConfig_t* config, int shrinkFlags),                                                      \
    (comm, excludeRanksList, excludeRanksCount, newcomm, config, shrinkFlags))                    \
  X(ncclResult_t, ncclCommFinalize, (ncclComm_t comm), (comm))                                    \
  X(ncclResult_t, ncclCommDestroy, (ncclComm_t comm), (comm))                                     \
  X(ncclResult_t, ncclCommAbort, (ncclComm_t comm), (comm))                                       \
  X(ncclResult_t, ncclCommRevoke, (ncclComm_t comm, int revokeFlags), (comm, revokeFlags))        \
  X(ncclResult_t, ncclCommGetAsyncError, (ncclComm_t comm, ncclResult_t * asyncError),            \
    (comm, asyncError))

/* Pure pass-through: forwarded untouched; present so that a NCCL lacking one gives a clear
 * error instead of an unresolved symbol. X(ret, name, params, args, value_if_missing). */
#define NCCLWATCH_FOR_EACH_PASSTHROUGH(X)                                                        \
  X(ncclResult_t, ncclGetVersion, (int* version), (version), ncclInvalidUsage)                    \
  X(const char*, ncclGetErrorString, (ncclResult_t result), (result),                             \
    "ncclwatch: the loaded NCCL has no ncclGetErrorString")                                       \
  X(const char*, ncclGetLastError, (ncclComm_t comm), (comm), "")                                 \
  X(ncclResult_t, ncclCommCount, (const ncclComm_t comm, int* count), (comm, count),              \
    ncclInvalidUsage)                                                                             \
  X(ncclResult_t, ncclCommCuDevice, (const ncclComm_t comm, int* device), (comm, device),         \
    ncclInvalidUsage)                                                                             \
  X(ncclResult_t, ncclCommUserRank, (const ncclComm_t comm, int* rank), (comm, rank),             \
    ncclInvalidUsage)                                                                             \
  X(ncclResult_t, ncclCommRegister, (const ncclComm_t comm, void* buff, size_t size, void** handle), \
    (comm, buff, size, handle), ncclInvalidUsage)                                                 \
  X(ncclResult_t, ncclCommDeregister, (const ncclComm_t comm, void* handle), (comm, handle),      \
    ncclInvalidUsage)                                                                             \
  X(ncclResult_t, ncclCommWindowRegister,                                                         \
    (ncclComm_t comm, void* buff, size_t size, ncclWindow_t* win, int winFlags),                  \
    (comm, buff, size, win, winFlags), ncclInvalidUsage)                                          \
  X(ncclResult_t, ncclCommWindowDeregister, (ncclComm_t comm, ncclWindow_t win), (comm, win),     \
    ncclInvalidUsage)                                                                             \
  X(ncclResult_t, ncclMemAlloc, (void** ptr, size_t size), (ptr, size), ncclInvalidUsage)         \
  X(ncclResult_t, ncclMemFree, (void* ptr), (ptr), ncclInvalidUsage)                              \
  X(ncclResult_t, ncclRedOpCreatePreMulSum,                                                       \
    (ncclRedOp_t * op, void* scalar, ncclDataType_t datatype, ncclScalarResidence_t residence,    \
     ncclComm_t comm),                                                                            \
    (op, scalar, datatype, residence, comm), ncclInvalidUsage)                                    \
  X(ncclResult_t, ncclRedOpDestroy, (ncclRedOp_t op, ncclComm_t comm), (op, comm),                \
    ncclInvalidUsage)

/* Function declarations of the whole wrapped API, from the lists (for the simulator and C
 * programs compiled against this header instead of nccl.h). */
#ifndef NCCL_H_
#ifdef __cplusplus
extern "C" {
#endif
/* The NCCL API is exported by whoever defines it (the simulator, libncclwatch), even in a
 * build with -fvisibility=hidden. */
#define NCCLWATCH_NCCL_API __attribute__((visibility("default")))
#define NCCLWATCH_DECLARE_OPERATION(name, kind, params, args, c, d, r, p) NCCLWATCH_NCCL_API ncclResult_t name params;
#define NCCLWATCH_DECLARE_FUNCTION(ret, name, params, args, ...) NCCLWATCH_NCCL_API ret name params;
NCCLWATCH_FOR_EACH_OPERATION(NCCLWATCH_DECLARE_OPERATION)
NCCLWATCH_FOR_EACH_MANAGED(NCCLWATCH_DECLARE_FUNCTION)
NCCLWATCH_FOR_EACH_PASSTHROUGH(NCCLWATCH_DECLARE_FUNCTION)
#undef NCCLWATCH_DECLARE_OPERATION
#undef NCCLWATCH_DECLARE_FUNCTION
#ifdef __cplusplus
}
#endif
#endif /* !NCCL_H_ */

#endif /* NCCLWATCH_NCCL_ABI_H */
