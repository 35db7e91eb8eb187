// Built only where a real nccl.h exists: every function in our X-macro lists must have exactly
// the real signature, and the types we declare ourselves must have the real layout.
#include <nccl.h>

#include <cstddef>
#include <type_traits>

#include "ncclwatch/nccl_abi.h"  // NCCL_H_ is defined: only the lists are taken from it

#define NCCLWATCH_CHECK_OP(name, kind, params, args, c, d, r, p)                               \
  static_assert(std::is_same<decltype(&::name), ncclResult_t(*) params>::value,                 \
                #name ": signature differs from the real nccl.h");
#define NCCLWATCH_CHECK_FN(ret, name, params, args, ...)                                        \
  static_assert(std::is_same<decltype(&::name), ret(*) params>::value,                          \
                #name ": signature differs from the real nccl.h");
NCCLWATCH_FOR_EACH_OPERATION(NCCLWATCH_CHECK_OP)
NCCLWATCH_FOR_EACH_MANAGED(NCCLWATCH_CHECK_FN)
NCCLWATCH_FOR_EACH_PASSTHROUGH(NCCLWATCH_CHECK_FN)

static_assert(sizeof(ncclUniqueId) == NCCLWATCH_ABI_UNIQUE_ID_SIZE, "ncclUniqueId size");
static_assert(offsetof(ncclConfig_t, commName) == NCCLWATCH_ABI_CONFIG_COMMNAME_OFFSET, "ncclConfig_t.commName");
static_assert(sizeof(ncclConfig_t) >= NCCLWATCH_ABI_CONFIG_SIZE_2_28, "ncclConfig_t size");
static_assert(ncclInProgress == 7 && ncclInvalidUsage == 5, "ncclResult_t values");
static_assert(ncclBfloat16 == 9 && ncclFloat8e5m2 == 11, "ncclDataType_t values");
static_assert(ncclAvg == 4, "ncclRedOp_t values");
