// The exported NCCL entry points, generated from the lists in nccl_abi.h: every data-moving
// function records and forwards through GuardedOperation; pass-through functions forward
// untouched. Thin by design: forward, record, nothing else.
#include "intercept/launch.h"
#include "common/real_nccl.h"

using namespace ncclwatch;

extern "C" {

#define NCCLWATCH_DEFINE_OPERATION(name, kind, params, args, count_e, dtype_e, redop_e, rootpeer_e) \
  ncclResult_t name params {                                                                        \
    auto real = Real().name;                                                                         \
    if (!real) return MissingFunction(#name);                                                        \
    if (Runtime::Off()) return real args;                                                            \
    OpCall call{#name,                                                                               \
                trace::OpKind::kind,                                                                 \
                static_cast<uint64_t>(count_e),                                                      \
                static_cast<int>(dtype_e),                                                           \
                redop_e,                                                                             \
                rootpeer_e,                                                                          \
                comm,                                                                                \
                stream};                                                                             \
    return GuardedOperation(call, [&] { return real args; });                                        \
  }
NCCLWATCH_FOR_EACH_OPERATION(NCCLWATCH_DEFINE_OPERATION)
#undef NCCLWATCH_DEFINE_OPERATION

#define NCCLWATCH_DEFINE_PASSTHROUGH(ret, name, params, args, missing) \
  ret name params {                                                    \
    auto real = Real().name;                                           \
    if (!real) {                                                       \
      MissingFunction(#name);                                          \
      return missing;                                                  \
    }                                                                  \
    return real args;                                                  \
  }
NCCLWATCH_FOR_EACH_PASSTHROUGH(NCCLWATCH_DEFINE_PASSTHROUGH)
#undef NCCLWATCH_DEFINE_PASSTHROUGH

}  // extern "C"
